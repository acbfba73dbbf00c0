"""Validation of ListSessions, ListEpisodes and ForgetSession, and their page tokens."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from memsvc.config import Settings
from memsvc.errors import InvalidArgument
from memsvc.server import page_tokens, validate
from memsvc.storage.model import Scope
from memsvc.v1 import memory_pb2 as pb

# Each listing's tokens carry its own tag and the digest of its scope and filters
# (server/page_tokens.py): a token of another listing is refused.
_SESSIONS = "sessions"
_EPISODES = "episodes"


@dataclass(frozen=True)
class SessionsQuery:
    scope: Scope
    page_size: int
    after: tuple[datetime, str] | None


@dataclass(frozen=True)
class EpisodesQuery:
    scope: Scope
    page_size: int
    after: tuple[datetime, uuid.UUID] | None
    session_id: str


def sessions_listing(scope: Scope) -> str:
    """The digest a ListSessions page token is bound to."""
    return page_tokens.listing(_SESSIONS, scope.key)


def episodes_listing(scope: Scope, session_id: str) -> str:
    """The digest a ListEpisodes page token is bound to."""
    return page_tokens.listing(_EPISODES, scope.key, session_id)


def _decode(kind: str, rpc: str, listing: str, token: str) -> tuple[datetime, str]:
    at, key = page_tokens.decode(kind, rpc, listing, token, size=2)
    try:
        moment = datetime.fromisoformat(at)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise InvalidArgument(f"page_token: not a token returned by {rpc}")
    return moment, key


def encode_sessions_token(after: tuple[datetime, str], listing: str) -> str:
    return page_tokens.encode(_SESSIONS, listing, [after[0].isoformat(), after[1]])


def encode_episodes_token(after: tuple[datetime, uuid.UUID], listing: str) -> str:
    return page_tokens.encode(_EPISODES, listing, [after[0].isoformat(), str(after[1])])


def _page_size(value: int, settings: Settings) -> int:
    if value < 0 or value > settings.max_page_size:
        raise InvalidArgument(f"page_size: between 1 and {settings.max_page_size} (0: default)")
    return value or settings.default_page_size


def list_sessions(
    request: pb.ListSessionsRequest, tenant: str, settings: Settings
) -> SessionsQuery:
    scope = validate.scope(request.scope, tenant, settings, present=request.HasField("scope"))
    page_size = _page_size(request.page_size, settings)
    after = None
    if request.page_token:
        after = _decode(_SESSIONS, "ListSessions", sessions_listing(scope), request.page_token)
    return SessionsQuery(scope, page_size, after)


def list_episodes(
    request: pb.ListEpisodesRequest, tenant: str, settings: Settings
) -> EpisodesQuery:
    scope = validate.scope(request.scope, tenant, settings, present=request.HasField("scope"))
    page_size = _page_size(request.page_size, settings)
    session_id = validate.identifier(request.session_id, "session_id", settings, required=False)
    after = None
    if request.page_token:
        listing = episodes_listing(scope, session_id)
        at, key = _decode(_EPISODES, "ListEpisodes", listing, request.page_token)
        try:
            after = (at, uuid.UUID(key))
        except ValueError:
            raise InvalidArgument("page_token: not a token returned by ListEpisodes") from None
    return EpisodesQuery(scope, page_size, after, session_id)


def forget_session(
    request: pb.ForgetSessionRequest, tenant: str, settings: Settings
) -> tuple[Scope, str]:
    scope = validate.scope(request.scope, tenant, settings, present=request.HasField("scope"))
    return scope, validate.identifier(request.session_id, "session_id", settings, required=True)
