"""The SQLite file and its schema: checks before a file is opened, migrations, the pre-migration backup.

A migration runs under the write lock (``BEGIN IMMEDIATE``) together with its ``schema_migrations`` row, so
it commits whole or not at all; before the first one a file database is copied to an owner-only backup
next to it, removed once every migration has committed. A database of another application, or a file that
is not SQLite, is refused before anything writes to it.
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import stat
import struct
import time
from typing import Any

from ...errors import BackendUnavailable, InvalidArgument, MigrationError, StorageCorrupt
from ..base import MigrationInfo
from ..sql import from_micros, to_micros
from ..sql.migrations import Migration, pending, refuse_upgrade

_SQLITE_MAGIC = b"SQLite format 3\x00"
# SQLite's shared-memory WAL index (-shm): two copies of a 48-byte header, then the checkpoint info.
_SHM_HEADER = struct.Struct("=IIIBBHII")  # iVersion, unused, iChange, isInit, bigEndCksum, szPage, mxFrame
_SHM_VERSION = 3007000
_WAL_HEADER_BYTES = 32
_WAL_FRAME_HEADER_BYTES = 24


def wal_loss(path: str) -> dict[str, Any] | None:
    """What was lost if the WAL of the database at ``path`` vanished with commits not yet checkpointed.

    Read before SQLite opens the database (opening runs WAL recovery, which resets the index): the
    shared-memory index ``-shm`` records how many WAL frames were committed (``mxFrame``) and how many
    reached the database file (``nBackfill``). When committed frames were never checkpointed but the
    ``-wal`` file is gone, shorter than those frames, or a different WAL (other salts), those commits are
    lost — SQLite itself would open the older database silently. None when nothing was lost, or when
    another process is changing the index right now (then its WAL is in use, not lost).
    """
    first = _read_shm(path)
    if first is None:
        return None
    header, backfilled = first
    _, _, _, initialized, _, size_code, max_frame, _ = _SHM_HEADER.unpack_from(header)
    if not initialized or max_frame <= backfilled:
        return None
    page_size = 65536 if size_code == 1 else size_code
    needed = _WAL_HEADER_BYTES + max_frame * (_WAL_FRAME_HEADER_BYTES + page_size)
    wal = path + "-wal"
    try:
        with open(wal, "rb") as fh:
            wal_header = fh.read(_WAL_HEADER_BYTES)
            size = os.fstat(fh.fileno()).st_size
    except FileNotFoundError:
        wal_header, size = b"", -1
    if size >= needed and wal_header[16:24] == header[32:40]:
        return None  # the WAL holds every committed frame: SQLite recovers them on open
    if _read_shm(path) != first:
        return None  # the index changed meanwhile: a live process is using this WAL
    if size < 0:
        found = "missing"
    elif size < needed:
        found = f"{size} bytes of the {needed} its committed frames need"
    else:
        found = "another WAL (its salt differs)"
    return {
        "wal": wal,
        "wal_found": found,
        "frames_committed": max_frame,
        "frames_checkpointed": backfilled,
        "frames_lost": max_frame - backfilled,
        "page_size": page_size,
    }


def _read_shm(path: str) -> tuple[bytes, int] | None:
    """The settled WAL-index header of ``path``'s ``-shm`` and its nBackfill, or None."""
    try:
        with open(path + "-shm", "rb") as fh:
            head = fh.read(100)
    except (FileNotFoundError, PermissionError):
        return None
    if len(head) < 100 or head[:48] != head[48:96]:
        return None  # no index, or a header being written (its two copies differ)
    if _SHM_HEADER.unpack_from(head)[0] != _SHM_VERSION:
        return None
    return head[:48], struct.unpack_from("=I", head, 96)[0]


class SqliteSchema:
    """The schema half of :class:`~statekeel.backends.sqlite.backend.SqliteBackend`: migrations run on
    the writer's connection (its thread), file checks before it opens."""

    path: str | None
    migrate: bool
    busy_timeout_ms: int
    backup_path: str | None
    _where: str
    _migrations: list[Migration]
    # What wal_loss() found before the first connection opened, recorded as an incident once migrated.
    wal_lost: dict[str, Any] | None

    def _check_path(self) -> None:
        assert self.path is not None
        path = self.path
        if os.path.isdir(path):
            raise InvalidArgument(
                f"SQLite path {path} is a directory; give the path of a database file", path=path
            )
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise BackendUnavailable(
                f"directory {parent} of SQLite database {path} does not exist", path=path
            )
        if not self.migrate:
            self._refuse_to_create(path)
        self.wal_lost = wal_loss(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            try:
                with open(path, "rb") as fh:
                    header = fh.read(len(_SQLITE_MAGIC))
            except OSError as exc:
                raise BackendUnavailable(f"cannot read SQLite database {path}: {exc}", path=path) from exc
            if header and header != _SQLITE_MAGIC:
                raise StorageCorrupt(
                    f"{path} is not a SQLite database (no 'SQLite format 3' header); it was not modified",
                    path=path,
                ) from None
        except OSError as exc:
            raise BackendUnavailable(
                f"cannot create SQLite database {path}: {exc.strerror}", path=path
            ) from exc
        else:
            os.close(fd)

    def _refuse_to_create(self, path: str) -> None:
        """With ``migrate=False`` a missing or empty file is refused before SQLite touches it: opening it
        would create a database (journal_mode=WAL alone writes a 4 KB header)."""
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            raise BackendUnavailable(
                f"there is no SQLite database at {path}; it was opened with migrate=False, so none was "
                "created: check the path, or open it with migrate=True to create a store",
                path=path,
                hint="",
            ) from None
        if size == 0:
            raise MigrationError(
                f"{path} is an empty file, not a statekeel store (schema version 0). It was opened with "
                "migrate=False, so nothing was changed: open it with migrate=True to create the schema",
                version=0,
                pending=[m.version for m in self._migrations],
                path=path,
                hint="",
            )

    def _refuse_foreign(self, conn: sqlite3.Connection) -> bool:
        """True if the database has our schema_migrations table, False if it is empty; raises
        ``StorageCorrupt`` for another application's database."""
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "schema_migrations" not in tables:
            if tables:
                raise StorageCorrupt(
                    f"{self._where} is a SQLite database of another application (tables: "
                    f"{', '.join(sorted(tables)[:5])}); it was not modified",
                    path=self._where,
                )
            return False
        return True

    def _applied(self, conn: sqlite3.Connection) -> list[MigrationInfo]:
        if not self._refuse_foreign(conn):
            return []
        return [
            MigrationInfo(r[0], r[1], r[2], from_micros(r[3]))
            for r in conn.execute(
                "SELECT version, name, checksum, applied_at FROM schema_migrations ORDER BY version"
            )
        ]

    def _migrate(self, conn: sqlite3.Connection) -> None:
        # Refuses a newer schema or an edited migration before taking any lock or writing anything.
        applied = self._applied(conn)
        todo = pending(applied, self._migrations, where=self._where)
        if not todo:
            return
        if not self.migrate:
            refuse_upgrade(todo, applied, where=self._where)
        first = True
        while True:
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Re-read under the write lock: another process may have migrated meanwhile.
                applied = self._applied(conn)
                todo = pending(applied, self._migrations, where=self._where)
                if not todo:
                    conn.execute("COMMIT")
                    break
                if first and applied and self.path is not None:
                    # Under the lock, so the copy is exactly the state the migrations start from, and
                    # only the process that migrates takes one.
                    self.backup_path = self._backup(todo[0].version)
                first = False
                self._apply(conn, todo[0])
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        if self.backup_path is not None:
            os.unlink(self.backup_path)
            self.backup_path = None

    def _apply(self, conn: sqlite3.Connection, mig: Migration) -> None:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "checksum TEXT NOT NULL, applied_at INTEGER NOT NULL)"
        )
        try:
            for statement in split_statements(mig.sql):
                conn.execute(statement)
        except sqlite3.Error as exc:
            kept = f" (a copy taken before upgrading is at {self.backup_path})" if self.backup_path else ""
            raise MigrationError(
                f"{self._where}: migration {mig.version:04d}_{mig.name} failed: {exc}. The database is as it "
                f"was before this migration{kept}; fix the cause and open it again",
                version=mig.version,
                backup=self.backup_path,
                hint="",
            ) from exc
        conn.execute(
            "INSERT INTO schema_migrations (version, name, checksum, applied_at) VALUES (?, ?, ?, ?)",
            (mig.version, mig.name, mig.checksum, to_micros(dt.datetime.now(dt.UTC))),
        )

    def _backup(self, version: int) -> str:
        """Copy the database to an owner-only file next to it; return its path."""
        assert self.path is not None
        # Unique per process and instant; O_EXCL so an existing file is never overwritten.
        target = f"{self.path}.pre-v{version:04d}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.bak"
        fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        # A second connection reads the committed state (WAL lets it while the writer holds the write
        # lock): SQLite refuses to back up from a connection inside a write transaction.
        source = sqlite3.connect(self.path)
        try:
            source.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            dest = sqlite3.connect(target)
            try:
                source.backup(dest)
            finally:
                dest.close()
        except BaseException:
            os.unlink(target)
            raise
        finally:
            source.close()
        os.chmod(target, stat.S_IRUSR | stat.S_IWUSR)
        return target


def _only_comments(text: str) -> bool:
    return all(not line.strip() or line.strip().startswith("--") for line in text.splitlines())


def split_statements(script: str) -> list[str]:
    """Split a SQL script into complete statements (trigger bodies stay whole)."""
    statements: list[str] = []
    current = ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            if not _only_comments(current):
                statements.append(current.strip())
            current = ""
    if not _only_comments(current):
        raise MigrationError(f"incomplete SQL statement at the end of a migration: {current.strip()[:80]!r}")
    return statements
