"""The HTTP client of the JSON APIs memsvc calls (embeddings, chat models), over httpx."""

from memsvc.http.client import HTTPError, HTTPStatusError, HTTPTimeout, JSONClient

__all__ = ["HTTPError", "HTTPStatusError", "HTTPTimeout", "JSONClient"]
