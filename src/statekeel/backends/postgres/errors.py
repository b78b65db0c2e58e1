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


# A write refused because the server is a standby now (it was demoted, or the URL's first host answered as
# read-write before a switchover). With ``target_session_attrs=read-write`` the connection is on the wrong
# node: like a lost connection, it is dropped and the call runs again on the primary (the statement failed,
# so nothing was committed).
WRONG_NODE_ERRORS: tuple[type[BaseException], ...] = (asyncpg.ReadOnlySQLTransactionError,)

# Seconds a caller should wait before calling again after a failover error (a promotion takes seconds).
RETRY_AFTER_S = 1.0


def no_primary(exc: BaseException, target: PgTarget, waited: float) -> BackendUnavailable:
    """No host of the URL took a session matching ``target_session_attrs`` within
    ``failover_timeout``: the caller gets ``BackendUnavailable`` naming every host, with ``retry_after``."""
    if isinstance(exc, asyncpg.TargetServerAttributeNotMatched):
        why = (
            f"every host that answered is a standby or read-only (target_session_attrs="
            f"{target.session_attrs})"
        )
    else:
        why = target.scrub(f"{type(exc).__name__}: {exc}")
    return BackendUnavailable(
        f"{target}: no host of {target.host_list} is usable as {target.session_attrs} after "
        f"{waited:.1f} s ({why}). Nothing was written. A failover may be under way: call again in a few "
        "seconds; if it lasts, check that the URL names the primary and the cluster's failover manager",
        retry_after=RETRY_AFTER_S,
        hosts=target.host_list,
        hint="",
        **target.fields,
    )


def translate(exc: BaseException, target: PgTarget) -> BaseException:
    """Driver errors → statekeel errors with fields (host and database, never the password)."""
    if isinstance(exc, StatekeelError):
        return exc
    fields = target.fields
    detail = target.scrub(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, asyncpg.TargetServerAttributeNotMatched):
        return BackendUnavailable(
            f"{target}: none of the hosts {target.host_list} accepts a target_session_attrs="
            f"{target.session_attrs} session: every one that answered is a standby or read-only. A failover "
            "may be under way: call again in a few seconds; otherwise add the primary to the URL",
            retry_after=RETRY_AFTER_S,
            hosts=target.host_list,
            hint="",
            **fields,
        )
    if isinstance(exc, WRONG_NODE_ERRORS):
        where = (
            f"the store was opened with target_session_attrs={target.session_attrs} and reads only: open "
            "it with target_session_attrs=read-write to write"
            if target.read_only
            else "the server is a standby now (demoted by a failover): call again to reach the new primary"
        )
        return BackendUnavailable(
            f"{target}: the server refused a write ({detail}); {where}. Nothing was written",
            sqlstate=getattr(exc, "sqlstate", None),
            retry_after=None if target.read_only else RETRY_AFTER_S,
            hint="",
            **fields,
        )
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
