"""A small asyncio HTTP/1.1 client for the JSON APIs memsvc calls (embeddings, chat models)."""

from memsvc.http.client import HTTPClient, HTTPError, HTTPTimeout

__all__ = ["HTTPClient", "HTTPError", "HTTPTimeout"]
