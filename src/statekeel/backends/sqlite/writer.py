"""The SQLite writer thread: one connection, jobs run in order, writes committed in groups.

Write jobs waiting together are committed together: each runs in its own SAVEPOINT (a failing one rolls
back alone), then one COMMIT — and with ``durability="full"`` one fsync — acknowledges them all (group
commit). A job's future is settled only after its COMMIT, with one wake-up per event loop for the whole
group. At ``durability="normal"`` the backend may run a group on the caller's thread instead
(:meth:`Worker.try_inline`) when the thread is idle. An ``atomic()`` block holds the connection for its
duration: its operations arrive on the block's own queue. The reader is a ``Worker`` too (reads only).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import BackendUnavailable
from .errors import dead_connection, is_busy, translate

log = logging.getLogger("statekeel.sqlite")

_MAX_GROUP = 256
# Inline mode turns SQLite's autocheckpoint off; the writer thread checkpoints every so many commits.
_CHECKPOINT_EVERY = 200

# How often an idle writer looks whether its WAL file is still there (seconds).
WAL_WATCH_INTERVAL = 0.1

# Job kinds
WRITE, READ, ATOMIC, CALL, STOP, CHECKPOINT = range(6)


class WalWatch:
    """Notices the WAL file removed (an operator's ``rm agent.db-wal``) or replaced under a live writer.

    SQLite keeps writing into the WAL it opened, now a file without a name: the commits since the last
    checkpoint, and every one after, exist only there and are gone once the process stops. So the
    writer looks after every COMMIT (before the write is acknowledged) and every
    :data:`WAL_WATCH_INTERVAL` while idle; once the name is gone, or names another file, it checkpoints
    at once from its live connection (everything committed reaches the database file), records the
    incident (``on_removed``), and from then on checkpoints after every COMMIT, until the store is
    opened again. A ``kill -9`` at any point after a write was acknowledged loses nothing.
    """

    def __init__(self, path: str, on_removed: Callable[[sqlite3.Connection, dict[str, Any]], None]) -> None:
        self.path = path
        self._on_removed = on_removed
        self._ident: tuple[int, int] | None = None  # (device, inode) of the WAL this writer uses
        self.removed: str | None = None  # "missing" or "replaced" once noticed

    def _found(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def check(self, conn: sqlite3.Connection, *, committed: bool) -> None:
        """After a COMMIT (``committed``) or while idle; never raises (the commit stands either way)."""
        try:
            if self.removed is not None:
                if committed:
                    self._checkpoint(conn)
                return
            ident = self._found()
            if self._ident is None:
                # Armed by this connection's own COMMIT only. A WAL it merely saw may be removed rightly:
                # another process closing what it thinks is the last connection checkpoints and deletes it.
                if not committed:
                    return
                if ident is not None:
                    self._ident = ident
                    return
            elif ident == self._ident:
                return
            self.removed = "missing" if ident is None else "replaced"
            self._removed(conn)
        except Exception:  # never let the check fail a committed write or stop the thread
            log.exception("%s: checking the WAL file failed", self.path)

    def _checkpoint(self, conn: sqlite3.Connection) -> tuple[int, int, int]:
        busy, frames, done = conn.execute("PRAGMA wal_checkpoint(FULL)").fetchone()
        if busy or done < frames:
            log.error(
                "%s: the WAL file is gone and a checkpoint copied only %d of %d frames into the database "
                "(a reader or another writer held it); the next commit tries again",
                self.path,
                done,
                frames,
            )
        return int(busy), int(frames), int(done)

    def _removed(self, conn: sqlite3.Connection) -> None:
        busy, frames, done = self._checkpoint(conn)
        log.error(
            "%s: the WAL file was %s under this live store; its %d committed frames were checkpointed into "
            "the database (every commit is checkpointed from now on; recorded as an incident)",
            self.path,
            "deleted" if self.removed == "missing" else "replaced by another file",
            done,
        )
        found = {
            "wal_found": self.removed,
            "frames": frames,
            "frames_checkpointed": done,
            "checkpoint_complete": not busy and done >= frames,
        }
        self._on_removed(conn, found)
        self._checkpoint(conn)  # the incident's own commit, too


class Job:
    __slots__ = ("fn", "future", "inner", "kind", "loop")

    def __init__(
        self,
        kind: int,
        fn: Callable[[sqlite3.Connection], Any] | None,
        loop: asyncio.AbstractEventLoop,
        inner: queue.SimpleQueue[Job] | None = None,
    ) -> None:
        self.kind = kind
        self.fn = fn
        self.loop = loop
        self.future: asyncio.Future[Any] = loop.create_future()
        self.inner = inner

    @classmethod
    def checkpoint(cls) -> Job:
        """A job nobody waits for (no loop, no future): checkpoint the WAL."""
        job = cls.__new__(cls)
        job.kind = CHECKPOINT
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


def _resolve(job: Job, exc: BaseException | None, result: Any = None) -> None:
    try:
        job.loop.call_soon_threadsafe(_settle, job.future, exc, result)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


def _settle_all(outcomes: list[tuple[asyncio.Future[Any], BaseException | None, Any]]) -> None:
    for future, exc, result in outcomes:
        _settle(future, exc, result)


def transfer(target: asyncio.Future[Any], source: asyncio.Future[Any]) -> None:
    """Settle ``target`` like ``source`` (a job's future), unless its caller gave up on it."""
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (exc := source.exception()) is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


def _resolve_group(jobs: Sequence[Job], outcomes: Sequence[tuple[BaseException | None, Any]]) -> None:
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


class Worker:
    """A thread that owns one connection and runs jobs on it in order."""

    def __init__(self, name: str, connect: Callable[[], sqlite3.Connection], where: str) -> None:
        self._connect = connect
        self._where = where
        # SimpleQueue is implemented in C: a put/get costs less than a Condition round trip.
        self._queue: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._held: Job | None = None  # taken off the queue while forming a group; runs next
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
        self.wal_watch: WalWatch | None = None  # set by the backend for a database file's writer
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> asyncio.Future[Any]:
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
        if dead_connection(exc):
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
                if is_busy(exc):
                    return None
                return [(self._failed(exc), None)] * len(fns)
            return self._group_body(conn, fns, may_restart=False)
        finally:
            self._lock.release()

    def _committed(self, conn: sqlite3.Connection) -> None:
        # Before the commit is acknowledged: a WAL file removed under us is checkpointed now (WalWatch).
        if self.wal_watch is not None:
            self.wal_watch.check(conn, committed=True)
        # With autocheckpoint off (inline mode), the thread checkpoints every so many commits, so that no
        # caller's write ever pays for copying the WAL back into the database.
        self._commits += 1
        if self.inline and self._commits % _CHECKPOINT_EVERY == 0:
            self._queue.put(Job.checkpoint())

    def _run(self) -> None:
        jobs = self._queue
        while True:
            first = self._held
            if first is None:
                self._idle = True
                if self.wal_watch is None:
                    first = jobs.get()
                else:
                    try:
                        first = jobs.get(timeout=WAL_WATCH_INTERVAL)
                    except queue.Empty:
                        self._watch_idle()
                        continue
            self._idle = False
            self._held = None
            with self._lock:
                if not self._run_one(first):
                    return

    def _watch_idle(self) -> None:
        watch = self.wal_watch
        if watch is None or watch.removed is not None or not self._lock.acquire(blocking=False):
            return  # an inline write holds the connection: it checks after its own COMMIT
        try:
            if self._conn is not None and not self._stopped:
                watch.check(self._conn, committed=False)
        finally:
            self._lock.release()

    def _checkpoint(self) -> None:
        try:
            self._connection().execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:  # the next one retries; commits are unaffected
            log.warning("WAL checkpoint of %s failed: %s", self._where, exc)

    def _run_one(self, first: Job) -> bool:
        """Process one job (or a group of writes starting with it); False after STOP."""
        jobs = self._queue
        if first.kind == CHECKPOINT:
            self._checkpoint()
            return True
        if first.kind == STOP:
            self._stopped = True
            self._drop_connection()
            _resolve(first, None)
            return False
        batch = [first]
        if first.kind == WRITE:
            # Group every write already waiting: they share one COMMIT (and one fsync).
            while len(batch) < _MAX_GROUP:
                try:
                    nxt = jobs.get_nowait()
                except queue.Empty:
                    break
                if nxt.kind != WRITE:
                    self._held = nxt
                    break
                batch.append(nxt)
        try:
            if first.kind == WRITE:
                self._run_group(batch)
            elif first.kind == ATOMIC:
                self._run_atomic(first)
            elif first.kind == READ:
                self._run_read(first)
            else:
                self._run_call(first)
        except BaseException as exc:  # never let the thread die: fail the jobs instead
            for job in batch:
                _resolve(job, self._failed(exc))
        return True

    def _run_call(self, job: Job) -> None:
        assert job.fn is not None
        try:
            result = job.fn(self._connection())
        except BaseException as exc:
            _resolve(job, self._failed(exc))
        else:
            _resolve(job, None, result)

    def _run_read(self, job: Job) -> None:
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

    def _begin(self, conn: sqlite3.Connection, batch: list[Job]) -> bool:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            err = self._failed(exc)
            _resolve_group(batch, [(err, None)] * len(batch))
            return False
        return True

    def _run_group(self, batch: list[Job]) -> None:
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
                rollback_quietly(conn)
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
        self._committed(conn)
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

    def _run_atomic(self, job: Job) -> None:
        assert job.inner is not None
        conn = self._connection()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            _resolve(job, self._failed(exc))
            # Drain the block's queue until its end marker so the caller is never left waiting.
            while (inner := job.inner.get()).kind != STOP:
                _resolve(inner, BackendUnavailable(f"{self._where}: transaction did not start"))
            _resolve(inner, None)
            return
        _resolve(job, None)
        # Set once an operation's error rolled back the whole transaction: what follows in the block
        # fails with that error (it must not run, and commit, outside the transaction).
        lost: BaseException | None = None
        while True:
            inner = job.inner.get()
            if inner.kind == STOP:
                commit = inner.fn is not None
                if lost is not None:
                    rollback_quietly(conn)
                    _resolve(inner, self._block_lost(lost) if commit else None)
                    return
                try:
                    conn.execute("COMMIT" if commit else "ROLLBACK")
                except BaseException as exc:
                    rollback_quietly(conn)
                    _resolve(inner, self._failed(exc))
                else:
                    if commit:
                        self._committed(conn)
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


def rollback_quietly(conn: sqlite3.Connection) -> None:
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:  # gone already, or the connection itself was dropped
        pass


def commit_marker(conn: sqlite3.Connection) -> None:
    """Marks the end job of an atomic block as a COMMIT (its absence means ROLLBACK)."""
