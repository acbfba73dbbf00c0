"""Capture the statements a storage or retrieval function really runs, and Citus' plan of each.

``Recorder`` passes every call through to a real connection and keeps (sql, args) of each
statement, so a test runs memsvc's own code (its SQL and its argument building, never a
copy) and then asks the coordinator how it plans each statement: ``EXPLAIN`` with the same
arguments, in the same transaction (so the writes it explains see the rows they would).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

_TASK_COUNT = re.compile(r"Task Count: (\d+)")


@dataclass(frozen=True)
class Statement:
    sql: str
    args: tuple[Any, ...]


class Recorder:
    """A connection wrapper recording the statements run through it (and running them)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn
        self.statements: list[Statement] = []

    def _keep(self, sql: str, args: Sequence[Any]) -> None:
        self.statements.append(Statement(sql, tuple(args)))

    async def fetch(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self._keep(sql, args)
        return await self._conn.fetch(sql, *args, **kwargs)

    async def fetchrow(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self._keep(sql, args)
        return await self._conn.fetchrow(sql, *args, **kwargs)

    async def fetchval(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self._keep(sql, args)
        return await self._conn.fetchval(sql, *args, **kwargs)

    async def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self._keep(sql, args)
        return await self._conn.execute(sql, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@dataclass(frozen=True)
class Plan:
    statement: Statement
    text: str

    @property
    def distributed(self) -> bool:
        """Whether Citus planned it (it touches a distributed or reference table)."""
        return "Citus" in self.text

    @property
    def task_counts(self) -> list[int]:
        return [int(n) for n in _TASK_COUNT.findall(self.text)]

    @property
    def single_shard(self) -> bool:
        """One task on one shard, and no step that pulls rows to the coordinator first."""
        return self.task_counts == [1] and "pull to coordinator" not in self.text

    def describe(self) -> str:
        return f"{' '.join(self.statement.sql.split())[:300]}\n{self.text}"


_PARAM = re.compile(r"\$(\d+)(?!\d)")


async def _inlined(conn: asyncpg.Connection, statement: Statement) -> str:
    """The statement with each argument written in as a typed literal.

    Citus explains a router query by sending it to the worker with every argument bound,
    those of extension types (pgvector's) as untyped; once it has inlined the values into
    the shard query such an argument is referenced nowhere, and the worker's EXPLAIN fails
    ("could not determine data type of parameter $24"). Executing it is not affected. With
    literals, the plan is the one a bound execution gets (a custom plan of these values)."""
    types = (await conn.prepare(statement.sql)).get_parameters()
    literals = []
    for arg, pg_type in zip(statement.args, types, strict=True):
        name = await conn.fetchval("SELECT format_type($1::oid, NULL)", pg_type.oid)
        text = await conn.fetchval(f"SELECT quote_nullable(($1::{name})::text)", arg)
        literals.append(f"({text}::{name})")
    return _PARAM.sub(lambda m: literals[int(m.group(1)) - 1], statement.sql)


async def explain(conn: asyncpg.Connection, statement: Statement) -> Plan:
    rows = await conn.fetch(f"EXPLAIN (COSTS OFF) {await _inlined(conn, statement)}")
    return Plan(statement, "\n".join(r[0] for r in rows))


async def distributed_plans(conn: asyncpg.Connection, recorder: Recorder) -> list[Plan]:
    """The Citus plans of every recorded statement that touches a Citus table."""
    plans = [await explain(conn, s) for s in recorder.statements if _explainable(s.sql)]
    return [p for p in plans if p.distributed]


def _explainable(sql: str) -> bool:
    head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
    return head in {"SELECT", "INSERT", "UPDATE", "DELETE", "WITH"} or sql.lstrip().startswith("/*")
