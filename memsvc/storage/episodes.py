"""Episode rows as domain records (Prefetch's walk and ListEpisodes read the same columns)."""

from __future__ import annotations

import asyncpg

from memsvc.storage.model import EpisodeRecord, Scope


def episode_from_row(row: asyncpg.Record) -> EpisodeRecord:
    return EpisodeRecord(
        scope=Scope.from_row(row),
        episode_id=row["episode_id"],
        session_id=row["session_id"],
        title=row["title"],
        summary=row["summary"],
        excerpt=row["excerpt"],
        source_message_ids=tuple(row["source_message_ids"]),
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        expires_at=row["expires_at"],
        topics=tuple(row["topics"]) if "topics" in row else (),
    )
