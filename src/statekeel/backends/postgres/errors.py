"""asyncpg errors as statekeel errors with fields (host, port and database; never the password)."""

from __future__ import annotations

import asyncpg

from ...errors import BackendUnavailable, ConflictError, InvalidArgument, StatekeelError, StorageCorrupt
from .target import PgTarget

# The errors of a connection that is gone (or must be treated as gone): the call may be retried once.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
    asyncpg.InternalClientError,  # the protocol lost track of the connection's state: treat it as dead
    ConnectionError,
    OSError,
    TimeoutError,
)


def translate(exc: BaseException, target: PgTarget) -> BaseException:
    """Driver errors → statekeel errors with fields (host and database, never the password)."""
    if isinstance(exc, StatekeelError):
        return exc
    fields = target.fields
    detail = target.scrub(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError):
        return BackendUnavailable(
            f"{target}: authentication failed ({detail}); check the user and password in the URL",
            **fields,
        )
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return BackendUnavailable(
            f"{target}: database {target.database!r} does not exist on {target.host}; create it or fix "
            "the URL",
            **fields,
        )
    if isinstance(exc, CONNECTION_ERRORS):
        return BackendUnavailable(f"{target} is unreachable ({detail})", **fields)
    if isinstance(exc, asyncpg.IntegrityConstraintViolationError):
        return ConflictError(
            f"{target}: constraint failed: {target.scrub(str(exc))}",
            constraint=getattr(exc, "constraint_name", None),
        )
    if isinstance(exc, asyncpg.SerializationError | asyncpg.DeadlockDetectedError):
        return ConflictError(
            f"{target}: a concurrent transaction got in the way ({exc}); call again",
            sqlstate=exc.sqlstate,
            hint="",
        )
    if isinstance(exc, asyncpg.DataError):
        # SQLSTATE class 22 (and asyncpg's own argument checks): a value PostgreSQL cannot store, e.g.
        # NUL in text or an int out of range. Bad input, not an outage: no retry, no fallback file.
        return InvalidArgument(
            f"{target}: PostgreSQL refused a value ({detail}). Nothing was written; fix the value and call "
            "again",
            sqlstate=exc.sqlstate,
            hint="",
            **fields,
        )
    if isinstance(exc, asyncpg.UndefinedTableError | asyncpg.UndefinedColumnError):
        return StorageCorrupt(f"{target}: schema is damaged: {exc}", **fields)
    if isinstance(exc, asyncpg.PostgresError):
        return BackendUnavailable(f"{target}: {detail}", sqlstate=exc.sqlstate, **fields)
    return exc


def unknown_outcome(exc: BaseException, target: PgTarget) -> BackendUnavailable:
    # The COMMIT was sent but its answer never came: the write may or may not be durable. Retrying it
    # blindly could apply it twice, so the caller must re-read and decide.
    return BackendUnavailable(
        f"{target}: the connection was lost while committing ({target.scrub(str(exc))}); the write may or "
        "may not have been applied: re-read before retrying it",
        outcome="unknown",
        hint="",
        **target.fields,
    )
