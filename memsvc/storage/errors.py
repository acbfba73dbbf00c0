"""The one place where database errors become memsvc errors (by class, never by message)."""

from __future__ import annotations

import asyncpg

from memsvc.errors import InvalidArgument, MemsvcError, ResourceExhausted, Unavailable


def map_db_error(exc: BaseException) -> MemsvcError | None:
    """The memsvc error for a database failure, or None when it is not a database failure."""
    if isinstance(exc, asyncpg.TooManyConnectionsError):
        return ResourceExhausted("the database has no free connection; retry shortly")
    if isinstance(
        exc,
        asyncpg.PostgresConnectionError
        | asyncpg.InterfaceError
        | asyncpg.CannotConnectNowError
        | asyncpg.AdminShutdownError
        | asyncpg.CrashShutdownError
        # A connection whose protocol is stuck mid-message, e.g. the server terminated the
        # session (shutdown) between two queries of one leg; another connection will do.
        | asyncpg.InternalClientError
        | ConnectionError
        | OSError,
    ):
        return Unavailable("the database is unavailable; retry shortly")
    if isinstance(exc, asyncpg.DataError | asyncpg.CheckViolationError):
        return InvalidArgument("a value was rejected by the database (out of range or malformed)")
    if isinstance(exc, asyncpg.PostgresError):
        return Unavailable("the database could not complete the request; retry shortly")
    return None
