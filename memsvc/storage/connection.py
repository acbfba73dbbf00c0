"""The connection every storage function takes: one of its own, or a pool's proxy of one."""

from __future__ import annotations

from typing import TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

# A string: asyncpg's classes are generic only in their stubs (asyncpg-stubs), not at run time.
Connection: TypeAlias = "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"
