"""SQL of the core blocks: revisions of each exact scope's persona and human block.

The current text of a block is its revision with ``replaced_at IS NULL``. Writers call these
inside their transaction after taking the user's advisory lock (storage.locks.lock_user),
so two writers of one block never both see the same current revision.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from memsvc.storage.conditions import EXACT_SCOPE
from memsvc.storage.connection import Connection
from memsvc.storage.model import Row, Scope

PERSONA = "persona"
HUMAN = "human"
BLOCKS = (PERSONA, HUMAN)
REPLACE = "replace"
APPEND = "append"

_COLUMNS = (
    "tenant_id, user_id, persona_id, agent_id, block, revision, text, mode, author, reason,"
    " recorded_at, replaced_at"
)


@dataclass(frozen=True)
class Revision:
    """One written revision of a block (the current one has ``replaced_at`` None)."""

    scope: Scope
    block: str
    revision: int
    text: str
    mode: str
    author: str
    reason: str
    recorded_at: datetime
    replaced_at: datetime | None = None


def _revision(row: Row) -> Revision:
    return Revision(
        scope=Scope.from_row(row),
        block=row["block"],
        revision=row["revision"],
        text=row["text"],
        mode=row["mode"],
        author=row["author"],
        reason=row["reason"],
        recorded_at=row["recorded_at"],
        replaced_at=row["replaced_at"],
    )


async def current(conn: Connection, scope: Scope) -> dict[str, Revision]:
    """The scope's current revision of each block that was ever written."""
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM core_block_revisions WHERE {EXACT_SCOPE} AND replaced_at IS NULL",
        *scope.key,
    )
    return {r["block"]: _revision(r) for r in rows}


async def history(conn: Connection, scope: Scope, block: str, limit: int) -> list[Revision]:
    """The block's revisions, newest first, at most ``limit``."""
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM core_block_revisions WHERE {EXACT_SCOPE} AND block = $5"
        " ORDER BY revision DESC LIMIT $6",
        *scope.key,
        block,
        limit,
    )
    return [_revision(r) for r in rows]


async def write(
    conn: Connection,
    scope: Scope,
    block: str,
    *,
    text: str,
    mode: str,
    author: str,
    reason: str,
) -> Revision:
    """Replace the block's current revision by a new one holding ``text`` (the whole text
    after the write). Call under the user's lock, in the caller's transaction."""
    previous = await conn.fetchval(
        f"UPDATE core_block_revisions SET replaced_at = now() WHERE {EXACT_SCOPE}"
        " AND block = $5 AND replaced_at IS NULL RETURNING revision",
        *scope.key,
        block,
    )
    row = await conn.fetchrow(
        f"INSERT INTO core_block_revisions ({_COLUMNS})"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, now(), NULL)"
        f" RETURNING {_COLUMNS}",
        *scope.key,
        block,
        (previous or 0) + 1,
        text,
        mode,
        author,
        reason,
    )
    assert row is not None
    return _revision(row)


@dataclass(frozen=True)
class HumanRoom:
    """What bounds a scope's core facts: the tenant's human-block limit (None: the server
    default) and the characters the block's written text takes."""

    tenant_limit: int | None
    text_chars: int


async def human_room(conn: Connection, scope: Scope) -> HumanRoom:
    """Read inside the compacting transaction, so the text and limit are the ones it commits
    against (the user's lock keeps another writer of the text out meanwhile)."""
    row = await conn.fetchrow(
        "SELECT (SELECT human_block_max_chars FROM tenant_settings WHERE tenant_id = $1)"
        " AS tenant_limit,"
        f" (SELECT length(text) FROM core_block_revisions WHERE {EXACT_SCOPE}"
        "   AND block = 'human' AND replaced_at IS NULL) AS text_chars",
        *scope.key,
    )
    assert row is not None
    return HumanRoom(row["tenant_limit"], row["text_chars"] or 0)


async def tenant_limits(conn: Connection, tenant_id: str) -> tuple[int | None, int | None]:
    """The tenant's (human, persona) block limits; None: the server default."""
    row = await conn.fetchrow(
        "SELECT human_block_max_chars, persona_block_max_chars FROM tenant_settings"
        " WHERE tenant_id = $1",
        tenant_id,
    )
    if row is None:
        return None, None
    return row["human_block_max_chars"], row["persona_block_max_chars"]
