"""ListSessions, ListEpisodes and ForgetSession over storage and the packet cache."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from memsvc.cache.invalidation import PacketInvalidator
from memsvc.concurrency.deadline import Budget
from memsvc.errors import NotFound
from memsvc.storage import changes
from memsvc.storage import sessions as store
from memsvc.storage.episodes import episode_from_row
from memsvc.storage.model import EpisodeRecord, Scope
from memsvc.storage.pool import acquire
from memsvc.storage.sessions import SessionForgotten, SessionRow

SessionKey = tuple[datetime, str]
EpisodeKey = tuple[datetime, uuid.UUID]


@dataclass(frozen=True)
class SessionPage:
    sessions: list[SessionRow]
    # The keyset of the last session shown when more follow (None: last page).
    next_after: SessionKey | None


@dataclass(frozen=True)
class EpisodePage:
    episodes: list[EpisodeRecord]
    next_after: EpisodeKey | None


class SessionService:
    """A scope's sessions and episodes, and the hard deletion of one session."""

    def __init__(
        self, pool: asyncpg.Pool, invalidator: PacketInvalidator, *, acquire_timeout_s: float
    ) -> None:
        self._pool = pool
        self._invalidator = invalidator
        # Each write wakes the user's change watchers where the trigger cannot (Citus).
        self._waker = changes.Waker()
        self._acquire_timeout_s = acquire_timeout_s

    async def list_sessions(
        self, scope: Scope, page_size: int, after: SessionKey | None, budget: Budget
    ) -> SessionPage:
        async with acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn:
            rows = await store.list_sessions(conn, scope, limit=page_size + 1, after=after)
        shown = rows[:page_size]
        more = len(rows) > page_size and shown
        return SessionPage(
            shown, (shown[-1].last_message_at, shown[-1].session_id) if more else None
        )

    async def list_episodes(
        self,
        scope: Scope,
        page_size: int,
        after: EpisodeKey | None,
        session_id: str,
        budget: Budget,
    ) -> EpisodePage:
        async with acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn:
            rows = await store.list_episodes(
                conn, scope, limit=page_size + 1, after=after, session_id=session_id
            )
        shown = [episode_from_row(r) for r in rows[:page_size]]
        more = len(rows) > page_size and shown
        return EpisodePage(shown, (shown[-1].ended_at, shown[-1].episode_id) if more else None)

    async def forget_session(
        self, scope: Scope, session_id: str, budget: Budget
    ) -> SessionForgotten:
        """Delete the session in one transaction under the user's lock (storage.sessions says
        what goes and what stays); NotFound, with nothing deleted, for an unknown session."""
        async with (
            acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn,
            conn.transaction(),
        ):
            done = await store.forget_session(conn, scope, session_id)
            if done is None:
                raise NotFound(
                    "session_id: no session with this id in this scope; nothing was deleted"
                )
            await self._waker.bump(conn, scope.tenant_id, scope.user_id)
        await self._invalidator.drop_user(scope.tenant_id, scope.user_id)
        return done
