"""SQLite driver errors as statekeel errors with fields, and the error shapes the writer acts on."""

from __future__ import annotations

import sqlite3

from ...errors import BackendUnavailable, ConflictError, StatekeelError, StorageCorrupt

DAMAGED_HINT = (
    "Run store.recover() to list what is unreadable; then restore the file from a backup, or rebuild it "
    "with sqlite3's .recover into a new file"
)


def translate(exc: BaseException, where: str) -> BaseException:
    """Turn a driver error into a statekeel error with fields; leave everything else alone."""
    if isinstance(exc, StatekeelError) or not isinstance(exc, sqlite3.Error):
        return exc
    text = str(exc)
    low = text.lower()
    code = getattr(exc, "sqlite_errorname", None)
    if isinstance(exc, sqlite3.IntegrityError):
        return ConflictError(f"{where}: constraint failed: {text}", constraint=text)
    if is_busy(exc):
        return BackendUnavailable(
            f"{where} is locked by another writer past busy_timeout ({text})", path=where, code=code
        )
    if "readonly" in low or "read-only" in low:
        return BackendUnavailable(f"{where} is not writable ({text})", path=where, code=code)
    if "malformed" in low or "corrupt" in low:
        return StorageCorrupt(
            f"{where} is damaged ({text})",
            path=where,
            code=code,
            hint=DAMAGED_HINT,
        )
    if "not a database" in low or "no such table" in low:
        return StorageCorrupt(f"{where} is not a usable statekeel database: {text}", path=where, code=code)
    return BackendUnavailable(f"{where}: {text}", path=where, code=code)


def is_busy(exc: BaseException) -> bool:
    """SQLite's write lock is held by another connection (SQLITE_BUSY / "database is locked")."""
    low = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in low or "busy" in low)


def dead_connection(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.ProgrammingError):
        return "closed" in str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and "disk i/o" in str(exc).lower()
