"""Validation of ListSessions, ListEpisodes and ForgetSession, and their page tokens."""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass
from datetime import datetime

import orjson

from memsvc.config import Settings
from memsvc.errors import InvalidArgument
from memsvc.server import validate
from memsvc.storage.model import Scope
from memsvc.v1 import memory_pb2 as pb

# Each listing's tokens carry its own tag: a token of another listing is refused.
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


def _encode(kind: str, at: datetime, key: str) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([kind, at.isoformat(), key])).decode("ascii")


def _decode(kind: str, rpc: str, token: str) -> tuple[datetime, str]:
    try:
        tag, at, key = orjson.loads(base64.urlsafe_b64decode(token.encode()))
        if tag != kind or not isinstance(key, str):
            raise ValueError(tag)
        moment = datetime.fromisoformat(at)
        if moment.tzinfo is None:
            raise ValueError(at)
        return moment, key
    except (binascii.Error, orjson.JSONDecodeError, ValueError, TypeError, UnicodeError):
        raise InvalidArgument(f"page_token: not a token returned by {rpc}") from None


def encode_sessions_token(after: tuple[datetime, str]) -> str:
    return _encode(_SESSIONS, *after)


def encode_episodes_token(after: tuple[datetime, uuid.UUID]) -> str:
    return _encode(_EPISODES, after[0], str(after[1]))


def _page_size(value: int, settings: Settings) -> int:
    if value < 0 or value > settings.max_page_size:
        raise InvalidArgument(f"page_size: between 1 and {settings.max_page_size} (0: default)")
    return value or settings.default_page_size


def list_sessions(
    request: pb.ListSessionsRequest, tenant: str, settings: Settings
) -> SessionsQuery:
    scope = validate.scope(request.scope, tenant, settings, present=request.HasField("scope"))
    page_size = _page_size(request.page_size, settings)
    after = _decode(_SESSIONS, "ListSessions", request.page_token) if request.page_token else None
    return SessionsQuery(scope, page_size, after)


def list_episodes(
    request: pb.ListEpisodesRequest, tenant: str, settings: Settings
) -> EpisodesQuery:
    scope = validate.scope(request.scope, tenant, settings, present=request.HasField("scope"))
    page_size = _page_size(request.page_size, settings)
    session_id = validate.identifier(request.session_id, "session_id", settings, required=False)
    after = None
    if request.page_token:
        at, key = _decode(_EPISODES, "ListEpisodes", request.page_token)
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
