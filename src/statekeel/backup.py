"""A consistent copy of a whole store in a new SQLite file: ``await store.backup("backup.db")``.

A SQLite store is copied with SQLite's online backup API from a connection of its own: it reads one
committed snapshot (WAL lets agents keep writing meanwhile) and the copy holds exactly that snapshot.
Any other store (PostgreSQL, memory://) is copied table by table into a new SQLite store with
:func:`statekeel.copy_store`, which compares every row at the end: stop its writers first, or the check
fails and nothing is kept.

The destination must not exist: a backup never overwrites a file. It is created owner-only (0600), and
removed again if the backup fails.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from .backends.base import StorageBackend
from .copy import copy_backend
from .errors import BackendUnavailable, InvalidArgument


@dataclass(frozen=True, slots=True)
class BackupReport:
    """Where the backup went, its size and how it was taken (``"sqlite-backup"`` or ``"copy"``)."""

    path: str
    bytes: int
    seconds: float
    method: str


class OpenedCopy(Protocol):
    """The new store a copied backup is written into (a :class:`statekeel.Store` is one)."""

    @property
    def backend(self) -> StorageBackend: ...

    async def close(self) -> None:
        """Flush and close it."""
        ...


OpenCopy = Callable[[str], Awaitable[OpenedCopy]]
"""Opens (creating and migrating) the store at a ``sqlite:///`` URL: ``statekeel.open_store``."""


def _reserve(dest: str) -> str:
    """Create ``dest`` empty and owner-only, refusing an existing file (never overwritten); its absolute
    path."""
    full = os.path.abspath(dest)
    parent = os.path.dirname(full)
    if not os.path.isdir(parent):
        raise InvalidArgument(f"backup destination {dest}: directory {parent} does not exist", path=dest)
    try:
        fd = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise InvalidArgument(
            f"backup destination {dest} already exists; a backup never overwrites a file: choose a new path "
            "or remove it first",
            path=dest,
            hint="",
        ) from None
    except OSError as exc:
        raise BackendUnavailable(f"cannot create backup file {dest}: {exc.strerror}", path=dest) from exc
    os.close(fd)
    return full


def discard_files(dest: str) -> None:
    """Remove the SQLite file ``dest`` and its -wal, -shm and -journal files, those that exist."""
    for path in (dest, dest + "-wal", dest + "-shm", dest + "-journal"):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _fold(path: str) -> None:
    """Fold the WAL of a freshly written SQLite copy into its file: one self-contained file is left (the
    copy is a WAL database like every store; whoever opens it recreates its -wal and -shm)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    for extra in (path + "-wal", path + "-shm"):
        try:
            os.unlink(extra)
        except FileNotFoundError:
            pass
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)  # the backup API may have recreated it


def _sqlite_backup(source_path: str, dest: str, busy_timeout_ms: int) -> None:
    source = sqlite3.connect(source_path)
    try:
        source.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        source.execute("PRAGMA query_only = ON")
        target = sqlite3.connect(dest)
        try:
            # One step: the whole copy reads one snapshot, however much is written meanwhile.
            source.backup(target)
        finally:
            target.close()
    finally:
        source.close()
    _fold(dest)


async def backup(
    backend: StorageBackend, dest: str | os.PathLike[str], *, busy_timeout_ms: int, open_copy: OpenCopy
) -> BackupReport:
    """See :meth:`statekeel.Store.backup`: ``backend`` is the store's, ``busy_timeout_ms`` how long the
    online backup waits for a lock, ``open_copy`` opens the new store a copied backup goes into."""
    if not isinstance(dest, str | os.PathLike):
        raise InvalidArgument(f"dest must be a file path, got {type(dest).__name__}")
    path = os.fspath(dest)
    if not isinstance(path, str) or not path:
        raise InvalidArgument(f"dest must be a non-empty file path, got {dest!r}")
    source_path = getattr(backend, "path", None)
    started = time.monotonic()
    # An existing file (the store's own included) is refused here, before anything is written.
    full = await asyncio.to_thread(_reserve, path)
    try:
        if isinstance(source_path, str):
            method = "sqlite-backup"
            await asyncio.to_thread(_sqlite_backup, source_path, path, busy_timeout_ms)
        else:
            method = "copy"
            copy = await open_copy("sqlite:///" + full)
            try:
                await copy_backend(backend, copy.backend)
            finally:
                await copy.close()
            await asyncio.to_thread(_fold, path)
    except BaseException:
        await asyncio.to_thread(discard_files, path)
        raise
    size = await asyncio.to_thread(lambda: os.stat(path).st_size)
    return BackupReport(path=path, bytes=size, seconds=time.monotonic() - started, method=method)


__all__ = ["BackupReport", "OpenCopy", "OpenedCopy", "backup"]
