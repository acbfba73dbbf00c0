"""The one vocabulary of database faults: what an outage raises, which SQLSTATE classes a retry
may cure and which it never will (by class, never by message), and the memsvc error each
becomes for a caller."""

from __future__ import annotations

import asyncpg

from memsvc.errors import InvalidArgument, MemsvcError, ResourceExhausted, Unavailable

# What a database outage raises from a pool or a connection: a server error, a closed
# connection or pool, a protocol left mid-message (a session the server ended), a socket
# error, an acquire or statement timeout. Background loops (workers, expiry, the listener,
# the reference flush, the packet warmer) outlive all of these.
DATABASE_DOWN: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)

# SQLSTATE classes that may succeed on another attempt.
TRANSIENT_SQLSTATES: tuple[type[asyncpg.PostgresError], ...] = (
    asyncpg.PostgresConnectionError,  # 08: the connection is gone
    asyncpg.TransactionRollbackError,  # 40: serialization failure, deadlock
    asyncpg.InsufficientResourcesError,  # 53: disk full, out of memory, too many connections
    asyncpg.OperatorInterventionError,  # 57: statement timeout, shutdown, starting up
    asyncpg.PostgresSystemError,  # 58: an I/O error on the server
    asyncpg.LockNotAvailableError,  # 55P03: lock_timeout
    asyncpg.ObjectInUseError,  # 55006
    asyncpg.InvalidCachedStatementError,  # 0A000 after a migration: prepared again next time
)
# SQLSTATE classes that the same statement on the same rows raises again.
PERMANENT_SQLSTATES: tuple[type[asyncpg.PostgresError], ...] = (
    asyncpg.DataError,  # 22: a value the column or function rejects (NUL byte, out of range)
    asyncpg.IntegrityConstraintViolationError,  # 23: a row a constraint refuses
    asyncpg.CardinalityViolationError,  # 21: e.g. one upsert touching a row twice
    asyncpg.SyntaxOrAccessError,  # 42: SQL that does not fit the schema (a bug or a bad deploy)
    asyncpg.FeatureNotSupportedError,  # 0A
    asyncpg.ProgramLimitExceededError,  # 54: a statement or value too large
)


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
