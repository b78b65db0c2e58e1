"""Driver (asyncmy) errors as statekeel errors with fields (host, port and database; never the password)."""

from __future__ import annotations

import asyncio
import re

from asyncmy import errors as my

from ...errors import (
    BackendUnavailable,
    ConflictError,
    InvalidArgument,
    InvalidKey,
    PayloadTooLarge,
    StatekeelError,
    StorageCorrupt,
)
from .target import MyTarget

# Server error codes (MariaDB's and MySQL's, shared).
ER_DUP_ENTRY = 1062
ER_LOCK_WAIT_TIMEOUT = 1205
ER_LOCK_DEADLOCK = 1213
ER_DATA_TOO_LONG = 1406
ER_TOO_LONG_KEY = 1071
ER_NET_PACKET_TOO_LARGE = 1153
ER_BAD_DB_ERROR = 1049
ER_ACCESS_DENIED = 1045
ER_DBACCESS_DENIED = 1044
ER_NO_SUCH_TABLE = 1146
ER_BAD_FIELD = 1054
ER_SIGNAL_EXCEPTION = 1644  # a trigger's SIGNAL: statekeel's append-only guards
ER_ROW_IS_REFERENCED = 1451
ER_NO_REFERENCED_ROW = 1452
ER_CHECK_CONSTRAINT = 4025
ER_TRUNCATED_WRONG_VALUE = 1366
ER_WARN_DATA_OUT_OF_RANGE = 1264

# The connection is gone (or must be taken as gone): the server went away, restarted, killed the session,
# or the client could not reach it. A call that met one may be retried once on a new connection.
_CONNECTION_CODES = frozenset(
    {
        1040,  # too many connections
        1053,  # server shutdown in progress
        1077,  # normal shutdown
        1152,  # aborted connection
        1927,  # connection was killed
        2002,  # can't connect (socket)
        2003,  # can't connect
        2005,  # unknown host
        2006,  # server has gone away
        2013,  # lost connection during query
        2014,  # commands out of sync (the protocol lost its place)
        2055,  # lost connection at reading
        4031,  # disconnected by the server (inactivity)
    }
)
_INTEGRITY_CODES = frozenset(
    {ER_DUP_ENTRY, ER_ROW_IS_REFERENCED, ER_NO_REFERENCED_ROW, 1048, 1451, 1452, 1557, 1586, 4025}
)
_DATA_CODES = frozenset({1264, 1265, 1292, 1366, 1367, 3140, 4038, 1690, 1365, 1411, 1418})

_TRANSPORT = (ConnectionError, OSError, asyncio.IncompleteReadError, EOFError, TimeoutError)
_KEY_COLUMN = re.compile(r"column '([^']+)'")


def code(exc: BaseException) -> int | None:
    """The server's (or client's) error code of a driver error, if it carries one."""
    if isinstance(exc, my.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


def is_connection_error(exc: BaseException) -> bool:
    if isinstance(exc, _TRANSPORT):
        return True
    if isinstance(exc, my.InterfaceError):
        return True  # asyncmy: "connection already closed" and the like
    c = code(exc)
    return c is not None and c in _CONNECTION_CODES


def is_deadlock(exc: BaseException) -> bool:
    return code(exc) == ER_LOCK_DEADLOCK


def target_detail(exc: BaseException, target: MyTarget) -> str:
    """A driver error as text for a message, the password scrubbed."""
    return target.scrub(f"{type(exc).__name__}: {exc}")


def duplicate_key(exc: BaseException) -> str | None:
    """The name of the unique key a duplicate-entry error was about (None: not a duplicate)."""
    if code(exc) != ER_DUP_ENTRY:
        return None
    found = re.search(r"for key '(?:[^'.]*\.)?([^']+)'", str(exc.args[1] if len(exc.args) > 1 else exc))
    return found.group(1) if found else ""


def translate(exc: BaseException, target: MyTarget) -> BaseException:
    """Driver errors → statekeel errors with fields (host and database, never the password)."""
    if isinstance(exc, StatekeelError):
        return exc
    fields = target.fields
    detail = target_detail(exc, target)
    c = code(exc)
    if c in (ER_ACCESS_DENIED, ER_DBACCESS_DENIED):
        return BackendUnavailable(
            f"{target}: access denied ({detail}); check the user and password in the URL", **fields
        )
    if c == ER_BAD_DB_ERROR:
        return BackendUnavailable(
            f"{target}: database {target.database!r} does not exist on {target.host}; create it "
            f"(CREATE DATABASE `{target.database}` CHARACTER SET utf8mb4) or fix the URL",
            **fields,
        )
    if c == ER_NET_PACKET_TOO_LARGE:
        return PayloadTooLarge(
            f"{target}: a value is larger than the server's max_allowed_packet ({detail}). Nothing was "
            "written; store a smaller value or raise max_allowed_packet on the server",
            hint="",
            **fields,
        )
    if is_connection_error(exc):
        return BackendUnavailable(f"{target} is unreachable ({detail})", **fields)
    if c in (ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT):
        return ConflictError(
            f"{target}: a concurrent transaction got in the way ({detail}); call again",
            code=c,
            hint="",
        )
    if c == ER_DATA_TOO_LONG:
        found = _KEY_COLUMN.search(str(exc))
        column = found.group(1) if found else "?"
        return InvalidKey(
            f"{target}: a value is too long for column {column!r} on MySQL/MariaDB ({detail}). Nothing was "
            "written; use a shorter key or value (see the MariaDB backend's limits in docs/mariadb.md)",
            column=column,
            hint="",
            **fields,
        )
    if c == ER_SIGNAL_EXCEPTION or c in _INTEGRITY_CODES:
        return ConflictError(f"{target}: constraint failed: {target.scrub(str(exc))}", code=c)
    if c in _DATA_CODES or isinstance(exc, my.DataError):
        return InvalidArgument(
            f"{target}: MariaDB refused a value ({detail}). Nothing was written; fix the value and call "
            "again",
            code=c,
            hint="",
            **fields,
        )
    if c in (ER_NO_SUCH_TABLE, ER_BAD_FIELD):
        return StorageCorrupt(f"{target}: schema is damaged: {detail}", **fields)
    if isinstance(exc, my.MySQLError):
        return BackendUnavailable(f"{target}: {detail}", code=c, **fields)
    return exc


def unknown_outcome(exc: BaseException, target: MyTarget) -> BackendUnavailable:
    """The COMMIT was sent but its answer never came: the write may or may not be durable."""
    return BackendUnavailable(
        f"{target}: the connection was lost while committing ({target.scrub(str(exc))}); the write may or "
        "may not have been applied: re-read before retrying it",
        outcome="unknown",
        hint="",
        **target.fields,
    )
