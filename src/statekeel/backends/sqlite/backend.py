"""SQLite backend: the embedded default (``sqlite:///file.db``) and ``memory://``.

One writer connection, owned by a writer thread. Write operations waiting together are committed
together: each runs in its own SAVEPOINT (a failing one rolls back alone), then one COMMIT — and with
``durability="full"`` one fsync — acknowledges them all (group commit). At ``durability="normal"``, where a
commit does not fsync, the writes issued during one turn of the event loop are committed as one such group
on the caller's thread when the writer thread is idle (two thread hand-offs would cost more than the
writes); if the thread is busy or another process holds the write lock, they go to the thread. An
``atomic()`` block holds the writer for its duration. Reads run on a separate connection and thread, each on
its own snapshot, so they never see another task's uncommitted writes and never wait for the writer.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import os
import queue
import sqlite3
import stat
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from ...codec import Codec
from ...errors import (
    BackendUnavailable,
    ConflictError,
    InvalidArgument,
    MigrationError,
    StatekeelError,
    StorageCorrupt,
)
from ..base import MigrationInfo
from ..sql import Op, Row, Tx, from_micros, load_queries, run_sync, to_micros
from ..sql.approvals import SqlApprovals
from ..sql.audit import SqlAudit
from ..sql.copy import SqlCopy
from ..sql.migrations import Migration, load_migrations, pending, refuse_upgrade
from ..sql.sessions import SqlSessions
from ..sql.tasks import SqlTasks
from ..sql.workflows import SqlWorkflows

log = logging.getLogger("statekeel.sqlite")

T = TypeVar("T")
_SQLITE_MAGIC = b"SQLite format 3\x00"
_MAX_GROUP = 256
# Inline mode turns SQLite's autocheckpoint off; the writer thread checkpoints every so many commits.
_CHECKPOINT_EVERY = 200

_QUERIES: dict[str, str] | None = None


def queries() -> dict[str, str]:
    global _QUERIES
    if _QUERIES is None:
        _QUERIES = load_queries(__package__ or "statekeel.backends.sqlite")
    return _QUERIES


def migrations_shipped() -> list[Migration]:
    return load_migrations("statekeel.backends.sqlite.migrations")


class SqliteTx(Tx):
    """Runs named queries on the thread's connection; its coroutines never suspend."""

    __slots__ = ("_ts", "_ts_raw", "codec", "conn", "sql")

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


# Job kinds
_WRITE, _READ, _ATOMIC, _CALL, _STOP, _CHECKPOINT = range(6)


class _Job:
    __slots__ = ("fn", "future", "inner", "kind", "loop")

    def __init__(
        self,
        kind: int,
        fn: Callable[[sqlite3.Connection], Any] | None,
        loop: asyncio.AbstractEventLoop,
        inner: queue.SimpleQueue[_Job] | None = None,
    ) -> None:
        self.kind = kind
        self.fn = fn
        self.loop = loop
        self.future: asyncio.Future[Any] = loop.create_future()
        self.inner = inner

    @classmethod
    def checkpoint(cls) -> _Job:
        """A job nobody waits for (no loop, no future): checkpoint the WAL."""
        job = cls.__new__(cls)
        job.kind = _CHECKPOINT
        job.fn = None
        job.inner = None
        return job


def _settle(future: asyncio.Future[Any], exc: BaseException | None, result: Any) -> None:
    if future.cancelled():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


def _resolve(job: _Job, exc: BaseException | None, result: Any = None) -> None:
    try:
        job.loop.call_soon_threadsafe(_settle, job.future, exc, result)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


def _settle_all(outcomes: list[tuple[asyncio.Future[Any], BaseException | None, Any]]) -> None:
    for future, exc, result in outcomes:
        _settle(future, exc, result)


def _transfer(target: asyncio.Future[Any], source: asyncio.Future[Any]) -> None:
    """Settle ``target`` like ``source`` (a job's future), unless its caller gave up on it."""
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (exc := source.exception()) is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


def _resolve_group(jobs: Sequence[_Job], outcomes: Sequence[tuple[BaseException | None, Any]]) -> None:
    """Settle a committed group with one wake-up per event loop, not one per job."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], BaseException | None, Any]]]
    by_loop = {}
    for job, (exc, result) in zip(jobs, outcomes, strict=True):
        by_loop.setdefault(job.loop, []).append((job.future, exc, result))
    for loop, settled in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle_all, settled)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


def translate(exc: BaseException, where: str) -> BaseException:
    """Turn a driver error into a statekeel error with fields; leave everything else alone."""
    if isinstance(exc, StatekeelError) or not isinstance(exc, sqlite3.Error):
        return exc
    text = str(exc)
    low = text.lower()
    code = getattr(exc, "sqlite_errorname", None)
    if isinstance(exc, sqlite3.IntegrityError):
        return ConflictError(f"{where}: constraint failed: {text}", constraint=text)
    if _is_busy(exc):
        return BackendUnavailable(
            f"{where} is locked by another writer past busy_timeout ({text})", path=where, code=code
        )
    if "readonly" in low or "read-only" in low:
        return BackendUnavailable(f"{where} is not writable ({text})", path=where, code=code)
    if "not a database" in low or "malformed" in low or "no such table" in low or "corrupt" in low:
        return StorageCorrupt(f"{where} is not a usable statekeel database: {text}", path=where, code=code)
    return BackendUnavailable(f"{where}: {text}", path=where, code=code)


def _is_busy(exc: BaseException) -> bool:
    """SQLite's write lock is held by another connection (SQLITE_BUSY / "database is locked")."""
    low = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in low or "busy" in low)


def _dead_connection(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.ProgrammingError):
        return "closed" in str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and "disk i/o" in str(exc).lower()


class _Worker:
    """A thread that owns one connection and runs jobs on it in order."""

    def __init__(self, name: str, connect: Callable[[], sqlite3.Connection], where: str) -> None:
        self._connect = connect
        self._where = where
        # SimpleQueue is implemented in C: a put/get costs less than a Condition round trip.
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._held: _Job | None = None  # taken off the queue while forming a group; runs next
        self._contended = False  # a recent group had a failing job: use savepoints from the start
        self._conn: sqlite3.Connection | None = None
        # Held while the connection is in use: by the thread for each job, or by a caller running a write
        # inline (see try_inline). Only the thread ever waits for it.
        self._lock = threading.Lock()
        self._idle = True  # the thread is waiting for work (read without the lock: a hint)
        self._stopped = False
        self.inline = False  # set by the backend: only where a commit never fsyncs (durability normal)
        self.busy_timeout_ms = 0
        self._commits = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: _Job) -> asyncio.Future[Any]:
        self._queue.put(job)
        return job.future

    def join(self) -> None:
        self._thread.join()

    # --- thread side ------------------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._connect()
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None

    def _failed(self, exc: BaseException) -> BaseException:
        # A dead connection is reopened on the next job; this one still fails, loudly.
        if _dead_connection(exc):
            log.warning("sqlite connection to %s failed (%s); reconnecting", self._where, exc)
            self._drop_connection()
        return translate(exc, self._where)

    def try_inline(
        self, fns: list[Callable[[sqlite3.Connection], Any]]
    ) -> list[tuple[BaseException | None, Any]] | None:
        """Run a group of writes on the caller's thread when the writer is idle; their outcomes, or None.

        Handing jobs to the thread and waking the event loop back costs more than the writes themselves
        when a commit does not fsync. None (the caller queues them) when the thread is busy or has work
        queued, or when another process holds SQLite's write lock: only the thread waits for that.
        """
        if not (self.inline and self._idle and self._held is None and self._queue.empty()):
            return None
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._stopped:
                return None
            conn = self._connection()
            try:
                conn.execute("PRAGMA busy_timeout = 0")
                try:
                    conn.execute("BEGIN IMMEDIATE")
                finally:
                    conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            except BaseException as exc:
                if _is_busy(exc):
                    return None
                return [(self._failed(exc), None)] * len(fns)
            return self._group_body(conn, fns, may_restart=False)
        finally:
            self._lock.release()

    def _committed(self) -> None:
        # With autocheckpoint off (inline mode), the thread checkpoints every so many commits, so that no
        # caller's write ever pays for copying the WAL back into the database.
        self._commits += 1
        if self.inline and self._commits % _CHECKPOINT_EVERY == 0:
            self._queue.put(_Job.checkpoint())

    def _run(self) -> None:
        jobs = self._queue
        while True:
            first = self._held
            if first is None:
                self._idle = True
                first = jobs.get()
            self._idle = False
            self._held = None
            with self._lock:
                if not self._run_one(first):
                    return

    def _checkpoint(self) -> None:
        try:
            self._connection().execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:  # the next one retries; commits are unaffected
            log.warning("WAL checkpoint of %s failed: %s", self._where, exc)

    def _run_one(self, first: _Job) -> bool:
        """Process one job (or a group of writes starting with it); False after STOP."""
        jobs = self._queue
        if first.kind == _CHECKPOINT:
            self._checkpoint()
            return True
        if first.kind == _STOP:
            self._stopped = True
            self._drop_connection()
            _resolve(first, None)
            return False
        batch = [first]
        if first.kind == _WRITE:
            # Group every write already waiting: they share one COMMIT (and one fsync).
            while len(batch) < _MAX_GROUP:
                try:
                    nxt = jobs.get_nowait()
                except queue.Empty:
                    break
                if nxt.kind != _WRITE:
                    self._held = nxt
                    break
                batch.append(nxt)
        try:
            if first.kind == _WRITE:
                self._run_group(batch)
            elif first.kind == _ATOMIC:
                self._run_atomic(first)
            elif first.kind == _READ:
                self._run_read(first)
            else:
                self._run_call(first)
        except BaseException as exc:  # never let the thread die: fail the jobs instead
            for job in batch:
                _resolve(job, self._failed(exc))
        return True

    def _run_call(self, job: _Job) -> None:
        assert job.fn is not None
        try:
            result = job.fn(self._connection())
        except BaseException as exc:
            _resolve(job, self._failed(exc))
        else:
            _resolve(job, None, result)

    def _run_read(self, job: _Job) -> None:
        assert job.fn is not None
        conn = self._connection()
        try:
            conn.execute("BEGIN")
            try:
                result = job.fn(conn)
            finally:
                conn.execute("COMMIT")
        except BaseException as exc:
            _resolve(job, self._failed(exc))
        else:
            _resolve(job, None, result)

    def _begin(self, conn: sqlite3.Connection, batch: list[_Job]) -> bool:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            err = self._failed(exc)
            _resolve_group(batch, [(err, None)] * len(batch))
            return False
        return True

    def _run_group(self, batch: list[_Job]) -> None:
        """Run a group of writes in one transaction and settle them after its COMMIT."""
        conn = self._connection()
        if not self._begin(conn, batch):
            return
        fns = [job.fn for job in batch]
        assert all(fn is not None for fn in fns)  # write jobs always carry their operation
        _resolve_group(batch, self._group_body(conn, fns, may_restart=True))  # type: ignore[arg-type]

    def _group_body(
        self,
        conn: sqlite3.Connection,
        fns: list[Callable[[sqlite3.Connection], Any]],
        *,
        may_restart: bool,
    ) -> list[tuple[BaseException | None, Any]]:
        """Run ``fns`` in the open transaction, COMMIT, and return each one's outcome.

        A failing job rolls back alone. Savepoints cost two statements per job, so where the transaction
        may be restarted (the thread, which may wait for the write lock again) a group first runs without
        them; if a job fails, the whole transaction is rolled back and the group runs again with each job
        in its own savepoint. Jobs are re-runnable: an operation touches only the database, through its
        Tx. After a failure the next groups go straight to savepoints until one runs clean (conflicts tend
        to come in bursts). Inline groups never give up the write lock midway: they use savepoints.
        """
        outcomes: list[tuple[BaseException | None, Any]] | None = None
        if len(fns) == 1 or (may_restart and not self._contended):
            outcomes = []
            for fn in fns:
                try:
                    outcomes.append((None, fn(conn)))
                except BaseException as exc:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                    if len(fns) == 1:  # its transaction was its own savepoint
                        return [(self._failed(exc), None)]
                    self._contended = True
                    outcomes = None
                    break
            if outcomes is None:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                except BaseException as exc:
                    err = self._failed(exc)
                    return [(err, None)] * len(fns)
        if outcomes is None:
            try:
                outcomes = [self._in_savepoint(conn, fn) for fn in fns]
            except _TransactionLost as lost:
                # Every job of the group ran in that transaction: none of them is written.
                self._rollback_quietly(conn)
                return [(lost.error, None)] * len(fns)
            self._contended = any(exc is not None for exc, _ in outcomes)
        try:
            conn.execute("COMMIT")
        except BaseException as exc:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            err = self._failed(exc)
            return [(err, None)] * len(fns)
        self._committed()
        return outcomes

    def _in_savepoint(
        self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], Any]
    ) -> tuple[BaseException | None, Any]:
        """Run ``fn`` in a savepoint: its outcome, its failure rolled back alone. ``_TransactionLost``
        when its error rolled back the whole transaction (disk full, I/O error), savepoint included."""
        conn.execute("SAVEPOINT op")
        try:
            result = fn(conn)
        except BaseException as exc:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    return self._failed(exc), None
                except sqlite3.Error:
                    pass
            raise _TransactionLost(self._failed(exc)) from None
        conn.execute("RELEASE op")
        return None, result

    @staticmethod
    def _rollback_quietly(conn: sqlite3.Connection) -> None:
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:  # gone already, or the connection itself was dropped
            pass

    def _run_atomic(self, job: _Job) -> None:
        assert job.inner is not None
        conn = self._connection()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            _resolve(job, self._failed(exc))
            # Drain the block's queue until its end marker so the caller is never left waiting.
            while (inner := job.inner.get()).kind != _STOP:
                _resolve(inner, BackendUnavailable(f"{self._where}: transaction did not start"))
            _resolve(inner, None)
            return
        _resolve(job, None)
        # Set once an operation's error rolled back the whole transaction: what follows in the block
        # fails with that error (it must not run, and commit, outside the transaction).
        lost: BaseException | None = None
        while True:
            inner = job.inner.get()
            if inner.kind == _STOP:
                commit = inner.fn is not None
                if lost is not None:
                    self._rollback_quietly(conn)
                    _resolve(inner, self._block_lost(lost) if commit else None)
                    return
                try:
                    conn.execute("COMMIT" if commit else "ROLLBACK")
                except BaseException as exc:
                    self._rollback_quietly(conn)
                    _resolve(inner, self._failed(exc))
                else:
                    _resolve(inner, None)
                return
            if lost is not None:
                _resolve(inner, self._block_lost(lost))
                continue
            assert inner.fn is not None
            try:
                exc_or_none, result = self._in_savepoint(conn, inner.fn)
            except _TransactionLost as gone:
                lost = gone.error
                _resolve(inner, lost)
                continue
            _resolve(inner, exc_or_none, result)

    def _block_lost(self, cause: BaseException) -> BackendUnavailable:
        return BackendUnavailable(
            f"{self._where}: an earlier error in this atomic() block rolled its whole transaction back "
            f"({cause}); nothing of the block was written",
            path=self._where,
        )


class _TransactionLost(Exception):
    """An operation's error rolled back the whole transaction, not only its savepoint."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _commit_marker(conn: sqlite3.Connection) -> None:
    """Marks the end job of an atomic block as a COMMIT (its absence means ROLLBACK)."""


class SqliteBackend(SqlSessions, SqlCopy, SqlTasks, SqlWorkflows, SqlAudit, SqlApprovals):
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
        self._writer: _Worker | None = None
        # Writes waiting for the end of the current event loop turn (inline mode).
        self._pending: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []
        self._reader: _Worker | None = None
        self._closed = False
        self.backup_path: str | None = None

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
                self._refuse_foreign(conn)
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise BackendUnavailable(f"{self._where}: could not enable WAL (journal_mode={mode})")
            conn.execute("PRAGMA synchronous = " + ("FULL" if self.durability == "full" else "NORMAL"))
            conn.execute("PRAGMA foreign_keys = ON")
            if read_only:
                conn.execute("PRAGMA query_only = ON")
            elif self.inline_writes:
                # Inline writes run on the caller's thread: the writer thread checkpoints instead.
                conn.execute("PRAGMA wal_autocheckpoint = 0")
        except BaseException:
            conn.close()
            raise
        return conn

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

    async def initialize(self) -> None:
        if self._writer is not None:
            return
        if self.path is not None:
            self._check_path()
        self._writer = _Worker("statekeel-sqlite-writer", lambda: self._open(read_only=False), self._where)
        self._writer.inline = self.inline_writes
        self._writer.busy_timeout_ms = self.busy_timeout_ms
        try:
            await self._call(self._writer, self._migrate)
            if self.path is not None:
                self._reader = _Worker(
                    "statekeel-sqlite-reader", lambda: self._open(read_only=True), self._where
                )
                # Connect now: a reader that cannot open fails the open, not the first load.
                await self._call(self._reader, lambda conn: None)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._closed:
            return
        if self._pending:
            self._flush_pending()  # writes accepted before close are written (or queued before STOP)
        self._closed = True
        for worker in (self._writer, self._reader):
            if worker is not None:
                await worker.submit(_Job(_STOP, None, asyncio.get_running_loop()))
                await asyncio.to_thread(worker.join)

    def _require_open(self) -> _Worker:
        if self._writer is None or self._closed:
            raise BackendUnavailable(
                f"store {self._where} is closed" if self._closed else "store not initialized"
            )
        return self._writer

    async def _call(self, worker: _Worker, fn: Callable[[sqlite3.Connection], T]) -> T:
        result: T = await worker.submit(_Job(_CALL, fn, asyncio.get_running_loop()))
        return result

    # --- migrations (run on the writer thread) --------------------------------------------------------

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
            raise MigrationError(
                f"{self._where}: migration {mig.version:04d}_{mig.name} failed: {exc}; the database is as it "
                "was before it",
                version=mig.version,
                backup=self.backup_path,
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

    async def schema_version(self) -> int:
        infos = await self.migrations()
        return max((m.version for m in infos), default=0)

    async def migrations(self) -> list[MigrationInfo]:
        return await self._call(self._require_open(), self._applied)

    async def integrity_check(self) -> list[str]:
        def check(conn: sqlite3.Connection) -> list[str]:
            rows = [str(r[0]) for r in conn.execute("PRAGMA integrity_check")]
            fk = [
                f"foreign key violation in {r[0]} rowid {r[1]}"
                for r in conn.execute("PRAGMA foreign_key_check")
            ]
            return ([] if rows == ["ok"] else rows) + fk

        return await self._call(self._require_open(), check)

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
        block: queue.SimpleQueue[_Job] | None = self._current.get()
        if block is not None:
            inner = _Job(_WRITE, job, loop)
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
        result = await writer.submit(_Job(_WRITE, job, loop))
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
                job = _Job(_WRITE, fn, loop)
                writer.submit(job)
                job.future.add_done_callback(functools.partial(_transfer, future))
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

    async def _plain_read(self, worker: _Worker, op: Op[T], *args: Any) -> T:
        result: T = await worker.submit(_Job(_READ, self._job(op, args), asyncio.get_running_loop()))
        return result

    @asynccontextmanager
    async def atomic(self) -> AsyncIterator[None]:
        if self._current.get() is not None:
            yield  # nested: join the outer transaction
            return
        writer = self._require_open()
        loop = asyncio.get_running_loop()
        block: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        start = _Job(_ATOMIC, None, loop, inner=block)
        writer.submit(start)
        end = _Job(_STOP, None, loop)
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
            end.fn = _commit_marker
            block.put(end)
            await end.future
            outcome.committed = True


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
