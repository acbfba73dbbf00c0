"""Page tokens: where the next page of a listing starts, bound to that listing.

A token carries its listing's kind (ListMemories, ListSessions, ListEpisodes), a digest of
what selects the listing (the tenant, the exact scope, the filters) and the position of the
last row sent. A token presented to another RPC, or with another scope or other filters, is
INVALID_ARGUMENT: a position in one listing means nothing in another, and the proto says a
token continues the listing it came from. The digest is checked, not signed: a forged token
can only move within a listing its caller may read anyway. page_size is not bound (a client
may change it between pages).
"""

from __future__ import annotations

import base64
import binascii
import hashlib

import orjson

from memsvc.errors import InvalidArgument

# Digest bytes: enough that two listings of one caller never share one by chance.
_DIGEST_BYTES = 12


def listing(*parts: object) -> str:
    """The digest of what selects a listing (tenant, scope, filters: JSON-serialisable)."""
    return hashlib.blake2b(orjson.dumps(parts), digest_size=_DIGEST_BYTES).hexdigest()


def encode(kind: str, of: str, position: list[str]) -> str:
    """The token continuing listing ``of`` (listing()) of ``kind`` after ``position``."""
    return base64.urlsafe_b64encode(orjson.dumps([kind, of, *position])).decode("ascii")


def decode(kind: str, rpc: str, of: str, token: str, size: int) -> list[str]:
    """The ``size`` position strings of a token encode() made for this kind and listing;
    InvalidArgument naming page_token and the rule (never the token) otherwise."""
    try:
        items = orjson.loads(base64.urlsafe_b64decode(token.encode()))
    except (binascii.Error, orjson.JSONDecodeError, ValueError, UnicodeError):
        items = None
    if (
        not isinstance(items, list)
        or len(items) != size + 2
        or items[0] != kind
        or not all(isinstance(i, str) for i in items)
    ):
        raise InvalidArgument(f"page_token: not a token returned by {rpc}")
    if items[1] != of:
        raise InvalidArgument(
            f"page_token: returned for another listing; send the first page's scope and"
            f" filters unchanged with it, or start again with an empty page_token ({rpc})"
        )
    return list(items[2:])
