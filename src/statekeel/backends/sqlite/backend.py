"""SQLite backend: the embedded default (``sqlite:///file.db``) and ``memory://``.

One writer connection, owned by a writer thread (:mod:`.writer`). Write operations waiting together are
committed together: each runs in its own SAVEPOINT (a failing one rolls back alone), then one COMMIT — and
with ``durability="full"`` one fsync — acknowledges them all (group commit). At ``durability="normal"``,
where a commit does not fsync, the writes issued during one turn of the event loop are committed as one such
group on the caller's thread when the writer thread is idle (two thread hand-offs would cost more than the
writes); if the thread is busy or another process holds the write lock, they go to the thread. An
``atomic()`` block holds the writer for its duration. Reads run on a separate connection and thread, each on
its own snapshot, so they never see another task's uncommitted writes and never wait for the writer.
Migrations and file checks are in :mod:`.schema`, error translation in :mod:`.errors`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import os
import queue
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from ...codec import Codec
from ...errors import BackendUnavailable, InvalidArgument
from ..base import Damage, DatabaseFiles, FreeSpace, MigrationInfo
from ..sql import Op, Row, Tx, from_micros, load_queries, run_sync, to_micros
from ..sql.approvals import SqlApprovals, op_scan_audit
from ..sql.audit import SqlAudit
from ..sql.branches import SqlBranches
from ..sql.checkpoints import SqlCheckpoints
from ..sql.copy import SqlCopy
from ..sql.encryption import SqlEncryption
from ..sql.erasure import SqlErasure
from ..sql.files import SqlFiles
from ..sql.incidents import SqlIncidents, op_record_incident
from ..sql.info import SqlInfo
from ..sql.memory import SqlMemory
from ..sql.migrations import Migration, load_migrations, pending
from ..sql.retention import SqlRetention
from ..sql.schedules import SqlSchedules
from ..sql.sessions import SqlSessions
from ..sql.tasks import SqlTasks
from ..sql.tool_calls import SqlToolCalls
from ..sql.traces import SqlTraces
from ..sql.vectors import SqlVectors
from ..sql.workflows import SqlWorkflows
from . import damage
from .errors import translate
from .schema import SqliteSchema
from .writer import (
    ATOMIC,
    CALL,
    READ,
    STOP,
    WRITE,
    Job,
    WalWatch,
    Worker,
    commit_marker,
    rollback_quietly,
    transfer,
)

T = TypeVar("T")

log = logging.getLogger("statekeel.sqlite")

_QUERIES: dict[str, str] | None = None


def queries() -> dict[str, str]:
    global _QUERIES
    if _QUERIES is None:
        _QUERIES = load_queries(__package__ or "statekeel.backends.sqlite")
    return _QUERIES


def migrations_shipped() -> list[Migration]:
    return load_migrations("statekeel.backends.sqlite.migrations")


def _file_size(path: str) -> int:
    """Bytes of a file; 0 when it does not exist (a WAL is removed when the last connection closes)."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _read_schema(conn: sqlite3.Connection) -> None:
    conn.execute("SELECT 1 FROM sessions LIMIT 0").fetchall()


class SqliteTx(Tx):
    """Runs named queries on the thread's connection; its coroutines never suspend."""

    __slots__ = ("_ts", "_ts_raw", "codec", "conn", "sql")
    segments = True

    def __init__(self, conn: sqlite3.Connection, codec: Codec) -> None:
        self.conn = conn
        self.codec = codec
        self.sql = queries()
        self._ts_raw: Any = None
        self._ts: dt.datetime | None = None

    async def execute(self, name: str, *args: Any) -> int:
        return self.conn.execute(self.sql[name], args).rowcount

    async def executemany(self, name: str, rows: Iterable[Sequence[Any]]) -> None:
        self.conn.executemany(self.sql[name], rows)

    async def fetchone(self, name: str, *args: Any) -> Row | None:
        row: Row | None = self.conn.execute(self.sql[name], args).fetchone()
        return row

    async def fetchall(self, name: str, *args: Any) -> list[Row]:
        return self.conn.execute(self.sql[name], args).fetchall()

    def ts_in(self, value: dt.datetime) -> Any:
        return to_micros(value)

    def ts_out(self, value: Any) -> dt.datetime:
        # Messages of one save share a timestamp: a loaded session converts each distinct value once.
        if value == self._ts_raw and self._ts is not None:
            return self._ts
        out = from_micros(value)
        self._ts_raw, self._ts = value, out
        return out


class SqliteBackend(
    SqliteSchema,
    SqlInfo,
    SqlIncidents,
    SqlSessions,
    SqlBranches,
    SqlToolCalls,
    SqlCopy,
    SqlTasks,
    SqlSchedules,
    SqlWorkflows,
    SqlAudit,
    SqlApprovals,
    SqlMemory,
    SqlFiles,
    SqlTraces,
    SqlVectors,
    SqlRetention,
    SqlCheckpoints,
    SqlEncryption,
    SqlErasure,
):
    """SQLite storage. ``path=None`` is an in-memory database (``memory://``)."""

    def __init__(
        self,
        url: str,
        path: str | None,
        *,
        codec: Codec,
        durability: str = "normal",
        busy_timeout_ms: int = 5000,
        migrations: list[Migration] | None = None,
        inline_writes: bool | None = None,
        migrate: bool = True,
    ) -> None:
        super().__init__(url, codec=codec)
        if durability not in ("normal", "full"):
            raise InvalidArgument(f"durability must be 'normal' or 'full', got {durability!r}")
        if type(busy_timeout_ms) is not int or busy_timeout_ms < 0:
            raise InvalidArgument(f"busy_timeout_ms must be a non-negative int, got {busy_timeout_ms!r}")
        self.path = path
        self.durability = durability
        self.migrate = migrate
        # At "normal" a commit does not fsync: running a write on the caller's thread when the writer is
        # idle is cheaper than two thread hand-offs. At "full" every write goes through the thread, where
        # concurrent writes share one fsync (group commit).
        self.inline_writes = durability == "normal" if inline_writes is None else inline_writes
        self.busy_timeout_ms = busy_timeout_ms
        self._migrations = migrations if migrations is not None else migrations_shipped()
        self._where = path or "memory://"
        self._writer: Worker | None = None
        # Writes waiting for the end of the current event loop turn (inline mode).
        self._pending: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []
        self._reader: Worker | None = None
        self._closed = False
        self.backup_path: str | None = None
        self.wal_lost: dict[str, Any] | None = None

    # --- lifecycle ------------------------------------------------------------------------------------

    def _open(self, *, read_only: bool) -> sqlite3.Connection:
        target = self.path if self.path is not None else ":memory:"
        conn = sqlite3.connect(target, isolation_level=None, check_same_thread=False, cached_statements=256)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            if self.path is not None:
                # Before anything that writes (switching to WAL rewrites the header): another
                # application's database must be left exactly as it is.
                if not self._refuse_foreign(conn) and not read_only:
                    # Only possible before the first table exists: a purge then gives space back with
                    # incremental_vacuum (older files need one VACUUM: Store.vacuum()).
                    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise BackendUnavailable(f"{self._where}: could not enable WAL (journal_mode={mode})")
            conn.execute("PRAGMA synchronous = " + ("FULL" if self.durability == "full" else "NORMAL"))
            conn.execute("PRAGMA foreign_keys = ON")
            if not read_only:
                # Deleted rows are overwritten with zeros, not left in free space: what store.erase (or a
                # purge) deletes is gone from the file once the WAL is checkpointed.
                conn.execute("PRAGMA secure_delete = ON")
            if read_only:
                conn.execute("PRAGMA query_only = ON")
            elif self.inline_writes:
                # Inline writes run on the caller's thread: the writer thread checkpoints instead.
                conn.execute("PRAGMA wal_autocheckpoint = 0")
        except BaseException:
            conn.close()
            raise
        return conn

    async def initialize(self) -> None:
        if self._writer is not None:
            return
        if self.path is not None:
            self._check_path()
        self._writer = Worker("statekeel-sqlite-writer", lambda: self._open(read_only=False), self._where)
        self._writer.inline = self.inline_writes
        self._writer.busy_timeout_ms = self.busy_timeout_ms
        if self.path is not None:
            self._writer.wal_watch = WalWatch(self.path + "-wal", self._wal_removed)
        try:
            await self._call(self._writer, self._migrate)
            if self.path is not None:
                self._reader = Worker(
                    "statekeel-sqlite-reader", lambda: self._open(read_only=True), self._where
                )
                # Connect now, and read the schema (SQLite parses all of it at a connection's first
                # statement): a reader that cannot open fails the open, and the first load is not slower.
                await self._call(self._reader, _read_schema)
            if self.wal_lost is not None:
                await self._record_wal_loss(self.wal_lost)
        except BaseException:
            await self.close()
            raise

    async def _record_wal_loss(self, found: dict[str, Any]) -> None:
        log.error(
            "%s: its WAL file was removed before %d committed frames reached the database: writes "
            "acknowledged since the last checkpoint are lost (recorded as an incident; see store.recover())",
            self._where,
            found["frames_lost"],
        )
        detail = {
            **found,
            "what_to_do": (
                "Writes acknowledged before the process stopped are missing from this database. Restore it "
                "from a backup taken before the loss if those writes matter, then acknowledge the incident "
                "(store.acknowledge_incident). Never delete a -wal file while a store may be open or has "
                "crashed."
            ),
        }
        await self.record_incident("wal_lost", self.codec.encode(detail))

    def _wal_removed(self, conn: sqlite3.Connection, found: dict[str, Any]) -> None:
        """Record, on the writer's connection (its own transaction), that the WAL was removed under it."""
        detail = {
            **found,
            "what_to_do": (
                "Someone deleted (or replaced) this database's -wal file while the store was open. "
                "Everything committed was checkpointed into the database file, so nothing acknowledged is "
                "lost, and this process checkpoints after every commit until it opens the store again. "
                "Close every process using the store, reopen it, then acknowledge the incident "
                "(store.acknowledge_incident). Never delete a -wal file while a store may be open."
            ),
        }
        conn.execute("BEGIN IMMEDIATE")
        try:
            run_sync(op_record_incident(SqliteTx(conn, self.codec), "wal_removed", self.codec.encode(detail)))
        except BaseException:
            rollback_quietly(conn)
            raise
        conn.execute("COMMIT")

    async def close(self) -> None:
        if self._closed:
            return
        if self._pending:
            self._flush_pending()  # writes accepted before close are written (or queued before STOP)
        self._closed = True
        for worker in (self._writer, self._reader):
            if worker is not None:
                await worker.submit(Job(STOP, None, asyncio.get_running_loop()))
                await asyncio.to_thread(worker.join)

    def _require_open(self) -> Worker:
        if self._writer is None or self._closed:
            raise BackendUnavailable(
                f"store {self._where} is closed" if self._closed else "store not initialized"
            )
        return self._writer

    async def _call(self, worker: Worker, fn: Callable[[sqlite3.Connection], T]) -> T:
        result: T = await worker.submit(Job(CALL, fn, asyncio.get_running_loop()))
        return result

    async def scan_audit(
        self,
        entries: Callable[[list[Any]], bool],
        approvals: Callable[[list[Any]], bool],
        *,
        page: int = 1000,
    ) -> None:
        if self.path is None or self._current.get() is not None:
            await super().scan_audit(entries, approvals, page=page)
            return
        self._require_open()
        job = self._job(op_scan_audit, (entries, approvals, page))

        # One snapshot for the whole walk, on a connection of its own: a long verify() of a large log
        # never holds up the reader that every load of this process shares.
        def scan() -> None:
            try:
                conn = self._open(read_only=True)
                try:
                    conn.execute("BEGIN")
                    try:
                        job(conn)
                    finally:
                        conn.execute("ROLLBACK")
                finally:
                    conn.close()
            except sqlite3.Error as exc:
                raise translate(exc, self._where) from exc

        await asyncio.to_thread(scan)

    async def schema_version(self) -> int:
        infos = await self.migrations()
        return max((m.version for m in infos), default=0)

    async def migrations(self) -> list[MigrationInfo]:
        return await self._call(self._require_open(), self._applied)

    async def pending_migrations(self) -> list[tuple[int, str]]:
        todo = pending(await self.migrations(), self._migrations, where=self._where)
        return [(m.version, m.name) for m in todo]

    async def database_files(self) -> DatabaseFiles | None:
        if self.path is None:
            return None
        self._require_open()
        return DatabaseFiles(self.path, _file_size(self.path), _file_size(self.path + "-wal"))

    async def integrity_check(self) -> list[str]:
        def check(conn: sqlite3.Connection) -> list[str]:
            # SQLite often stops its check at the first badly damaged page instead of listing problems:
            # that is a finding, not a failure to read the store (which the schema read above would be).
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            try:
                rows = [str(r[0]) for r in conn.execute("PRAGMA integrity_check")]
            except sqlite3.DatabaseError as exc:
                rows = [f"the integrity check stopped at a damaged page ({exc})"]
            try:
                fk = [
                    f"foreign key violation in {r[0]} rowid {r[1]}"
                    for r in conn.execute("PRAGMA foreign_key_check")
                ]
            except sqlite3.DatabaseError as exc:
                fk = [f"the foreign key check stopped at a damaged page ({exc})"]
            return ([] if rows == ["ok"] else rows) + fk

        return await self._call(self._require_open(), check)

    async def scan_damage(self) -> list[Damage]:
        if self.path is None:
            return []

        def scan(conn: sqlite3.Connection) -> list[Damage]:
            conn.execute("BEGIN")  # one snapshot for the whole scan
            try:
                return damage.scan(conn)
            finally:
                conn.execute("ROLLBACK")  # it only read

        return await self._call(self._reader or self._require_open(), scan)

    async def rebuild_indexes(self, tables: Sequence[str]) -> str | None:
        names = set(tables)
        path = self.path

        def reindex(conn: sqlite3.Connection) -> str | None:
            known = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            try:
                for table in sorted(names & known):  # names come from sqlite_master, never a caller
                    conn.execute(f'REINDEX "{table}"')
                return None
            except sqlite3.DatabaseError:
                if path is None:
                    raise
            # The damaged index pages cannot even be freed: write a copy whose indexes are built anew
            # from the rows, for a person to swap in with the agents stopped.
            target = f"{path}.rebuilt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
            # Created empty and owner-only first; never overwrites a file.
            os.close(os.open(target, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
            try:
                damage.rebuild_into(path, target)
            except BaseException:
                os.unlink(target)
                raise
            return target

        return await self._call(self._require_open(), reindex)

    # --- space --------------------------------------------------------------------------------------------

    def batch_pause(self, held: float) -> float:
        # Another process waiting for the lock polls it (SQLite's busy handler naps 1 to 100 ms): with no
        # gap between batches it would find it taken every time. Free half the time, it gets in quickly.
        return 0.0 if self.path is None else held

    async def free_space(self) -> FreeSpace | None:
        if self.path is None:
            return None

        def read(conn: sqlite3.Connection) -> FreeSpace:
            free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
            size = int(conn.execute("PRAGMA page_size").fetchone()[0])
            mode = int(conn.execute("PRAGMA auto_vacuum").fetchone()[0])
            return FreeSpace(free, size, incremental=mode == 2)

        return await self._call(self._require_open(), read)

    async def reclaim_space(self, max_pages: int) -> int:
        if self.path is None:
            return 0

        def reclaim(conn: sqlite3.Connection) -> int:
            if int(conn.execute("PRAGMA auto_vacuum").fetchone()[0]) != 2:
                return 0
            before = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
            # One short write transaction per call (the caller loops, other writers go in between).
            # executescript steps the pragma to completion: execute() would free a single page.
            conn.executescript(f"PRAGMA incremental_vacuum({int(max_pages)});")
            return before - int(conn.execute("PRAGMA freelist_count").fetchone()[0])

        return await self._call(self._require_open(), reclaim)

    async def shrink_log(self, *, wait: float = 0.0) -> bool:
        if self.path is None:
            return True

        def checkpoint(conn: sqlite3.Connection) -> bool:
            # PASSIVE copies the log without blocking other writers; TRUNCATE, which does block them
            # while it runs, then has almost nothing left to copy. It gives up (busy) past busy_timeout
            # while a reader's snapshot still needs the log's frames.
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            busy, log, done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            return not busy and log == done

        deadline = time.monotonic() + wait
        pause = 0.01
        while not await self._call(self._require_open(), checkpoint):
            if time.monotonic() >= deadline:
                return False
            # Off the writer's thread between tries: other writes go on while the reader finishes.
            await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.25)
        return True

    async def vacuum(self) -> FreeSpace | None:
        if self.path is None:
            return None

        def vacuum(conn: sqlite3.Connection) -> None:
            # VACUUM applies a changed auto_vacuum mode: later purges then give space back by themselves.
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

        await self._call(self._require_open(), vacuum)
        return await self.free_space()

    # --- operations -----------------------------------------------------------------------------------

    def _job(self, op: Op[T], args: tuple[Any, ...]) -> Callable[[sqlite3.Connection], T]:
        """The operation as a job for a connection's thread (it runs to completion in one call)."""
        codec = self.codec

        def job(conn: sqlite3.Connection) -> T:
            return run_sync(op(SqliteTx(conn, codec), *args))

        return job

    async def _write(self, op: Op[T], *args: Any) -> T:
        writer = self._require_open()
        job = self._job(op, args)
        loop = asyncio.get_running_loop()
        block: queue.SimpleQueue[Job] | None = self._current.get()
        if block is not None:
            inner = Job(WRITE, job, loop)
            block.put(inner)
            result: T = await inner.future
            return result
        if writer.inline:
            # Writes issued in the same turn of the event loop commit together (see _flush_pending).
            future: asyncio.Future[T] = loop.create_future()
            self._pending.append((job, future))
            if len(self._pending) == 1:
                loop.call_soon(self._flush_pending)
            return await future
        result = await writer.submit(Job(WRITE, job, loop))
        return result

    async def _write_bulk(self, op: Op[T], *args: Any) -> T:
        """A write that may take a while (a purge batch): on the writer thread, never inline on the
        caller's (the event loop would stall for it)."""
        writer = self._require_open()
        if self._current.get() is not None:
            return await self._write(op, *args)
        result: T = await writer.submit(Job(WRITE, self._job(op, args), asyncio.get_running_loop()))
        return result

    def _flush_pending(self) -> None:
        """Commit the writes collected during one turn of the event loop, as one group.

        Inline when the writer thread is idle (one transaction, no thread hand-off); otherwise they go to
        the thread's queue, where they are grouped just the same. A write whose caller was cancelled
        before this ran is not written.
        """
        batch, self._pending = self._pending, []
        live = [(fn, future) for fn, future in batch if not future.cancelled()]
        if not live:
            return
        writer = self._writer
        if writer is None or self._closed:
            for _, future in live:
                future.set_exception(BackendUnavailable(f"store {self._where} is closed"))
            return
        try:
            outcomes = writer.try_inline([fn for fn, _ in live])
        except BaseException as exc:  # a callback must not raise: give the error to every caller
            for _, future in live:
                if not future.done():
                    future.set_exception(translate(exc, self._where))
            return
        if outcomes is None:
            loop = asyncio.get_running_loop()
            for fn, future in live:
                job = Job(WRITE, fn, loop)
                writer.submit(job)
                job.future.add_done_callback(functools.partial(transfer, future))
            return
        for (_, future), (error, result) in zip(live, outcomes, strict=True):
            if future.done():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    async def _read(self, op: Op[T], *args: Any) -> T:
        writer = self._require_open()
        if self._current.get() is not None:
            return await self._write(op, *args)  # inside an atomic block: see its own writes
        # In memory there is a single connection: reads queue behind writes on the writer thread.
        return await self._plain_read(self._reader or writer, op, *args)

    async def _plain_read(self, worker: Worker, op: Op[T], *args: Any) -> T:
        result: T = await worker.submit(Job(READ, self._job(op, args), asyncio.get_running_loop()))
        return result

    @asynccontextmanager
    async def atomic(self) -> AsyncIterator[None]:
        if self._current.get() is not None:
            yield  # nested: join the outer transaction
            return
        writer = self._require_open()
        loop = asyncio.get_running_loop()
        block: queue.SimpleQueue[Job] = queue.SimpleQueue()
        start = Job(ATOMIC, None, loop, inner=block)
        writer.submit(start)
        end = Job(STOP, None, loop)
        with self._outermost_block() as outcome:
            token = self._current.set(block)
            try:
                await start.future
                yield
            except BaseException:
                self._current.reset(token)
                block.put(end)
                await asyncio.shield(end.future)
                raise
            self._current.reset(token)
            end.fn = commit_marker
            block.put(end)
            await end.future
            outcome.committed = True
