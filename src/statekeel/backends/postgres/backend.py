"""PostgreSQL backend (``postgresql://``): many agent instances on many machines share one database.

The same operations as SQLite run on pooled asyncpg connections; there is no instance-wide lock, so
independent calls proceed in parallel and conditional updates (``WHERE head_seq = $n``) do the
serializing. Migrations are serialized across processes with an advisory lock (:mod:`.schema`). URL options
are parsed by :class:`~.target.PgTarget`; driver errors are translated in :mod:`.errors`.

When the server goes away (restart, failover, ``pg_terminate_backend``) calls raise
``BackendUnavailable`` naming host and database, and the pool reconnects by itself. A call that met a
dead connection is retried once on a fresh one — reads always, writes only if COMMIT was not sent yet
(the server rolled the transaction back). A write whose COMMIT got no answer is never retried: it raises
``BackendUnavailable`` with ``outcome="unknown"``, and the caller re-reads (a conditional append then
tells whether it landed).

With several hosts in the URL (``postgresql://h1,h2/db?target_session_attrs=read-write``) each new
connection goes to the first host that is the primary, so after a failover the pool follows it: a call
that meets a dead connection, a host that refuses, or a demoted server (a write refused as read-only) drops
the pool's idle connections and runs again, at once and then with backoff (0.05 s doubling to 1 s), for up
to ``failover_timeout`` seconds (10 by default with several hosts, 0 — one retry — with one). Past that it
raises ``BackendUnavailable`` naming every host, with ``retry_after``. A COMMIT whose answer was lost is
never run again (see above): a session save settles it by its write id on the next save.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any, TypeVar

import asyncpg

from ...codec import Codec
from ...errors import (
    BackendUnavailable,
    ConflictError,
    InvalidArgument,
    InvalidTransition,
    LeaseLost,
    NotFound,
    StatekeelError,
)
from ..base import MigrationInfo, SessionRecord
from ..sql import SCHEMA_TABLES, Op, Row, Tx, load_queries
from ..sql.approvals import SqlApprovals
from ..sql.audit import SqlAudit
from ..sql.branches import SqlBranches
from ..sql.checkpoints import SqlCheckpoints
from ..sql.copy import SqlCopy
from ..sql.encryption import SqlEncryption
from ..sql.erasure import SqlErasure
from ..sql.files import SqlFiles
from ..sql.incidents import SqlIncidents
from ..sql.info import SqlInfo
from ..sql.memory import SqlMemory
from ..sql.migrations import Migration, load_migrations, pending
from ..sql.retention import SqlRetention
from ..sql.save import op_save_in_one_statement
from ..sql.schedules import SqlSchedules
from ..sql.sessions import SqlSessions
from ..sql.tasks import SqlTasks
from ..sql.tool_calls import SqlToolCalls
from ..sql.traces import SqlTraces
from ..sql.vectors import SqlVectors
from ..sql.workflows import SqlWorkflows
from .errors import CONNECTION_ERRORS, WRONG_NODE_ERRORS, no_primary, translate, unknown_outcome
from .schema import MIGRATION_LOCK_ID, PgSchema
from .target import CONNECT_TIMEOUT_S, DEFAULT_MAX_SIZE, DEFAULT_MIN_SIZE, PgTarget

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DEFAULT_MAX_SIZE",
    "DEFAULT_MIN_SIZE",
    "MIGRATION_LOCK_ID",
    "PgTarget",
    "PgTx",
    "PostgresBackend",
    "migrations_shipped",
    "queries",
    "translate",
]

log = logging.getLogger("statekeel.postgres")

T = TypeVar("T")

_QUERIES: dict[str, str] | None = None


def queries() -> dict[str, str]:
    global _QUERIES
    if _QUERIES is None:
        _QUERIES = load_queries(__package__ or "statekeel.backends.postgres")
    return _QUERIES


def migrations_shipped() -> list[Migration]:
    return load_migrations("statekeel.backends.postgres.migrations")


def _rowcount(status: str) -> int:
    # asyncpg returns the command tag, e.g. "UPDATE 3" or "INSERT 0 1".
    last = status.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else 0


class PgTx(Tx):
    __slots__ = ("codec", "conn", "lock", "sql")

    def __init__(self, conn: asyncpg.Connection, codec: Codec) -> None:
        self.conn = conn
        self.codec = codec
        self.sql = queries()
        # An atomic() block's operations may come from several tasks at once (child tasks inherit the
        # block); one connection runs one query at a time, so they take turns, as on SQLite.
        self.lock = asyncio.Lock()

    async def execute(self, name: str, *args: Any) -> int:
        return _rowcount(await self.conn.execute(self.sql[name], *args))

    async def executemany(self, name: str, rows: Iterable[Sequence[Any]]) -> None:
        await self.conn.executemany(self.sql[name], rows)

    async def fetchone(self, name: str, *args: Any) -> Row | None:
        row: Row | None = await self.conn.fetchrow(self.sql[name], *args)
        return row

    async def fetchall(self, name: str, *args: Any) -> list[Row]:
        rows: list[Row] = await self.conn.fetch(self.sql[name], *args)
        return rows

    def array_in(self, values: list[str | None]) -> Any:
        return values  # a text[] parameter

    def ts_in(self, value: dt.datetime) -> Any:
        return value

    def ts_out(self, value: Any) -> dt.datetime:
        if value.tzinfo is None:
            # asyncpg stores datetime.min and datetime.max (UTC) as -infinity / infinity, and reads those
            # back naive: they are still UTC (astimezone would take them for local time, and overflow).
            return value.replace(tzinfo=dt.UTC)  # type: ignore[no-any-return]
        result: dt.datetime = value.astimezone(dt.UTC)
        return result


_BACKOFF_FIRST_S = 0.05
_BACKOFF_MAX_S = 1.0


class _Retries:
    """When a call that lost its connection runs again: once at once (as with one host), then after a
    backoff doubling from 0.05 s to 1 s while ``failover_timeout`` has not passed since the first loss."""

    __slots__ = ("deadline", "delay", "started", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.started: float | None = None
        self.deadline = 0.0
        self.delay = _BACKOFF_FIRST_S

    async def again(self) -> bool:
        now = asyncio.get_running_loop().time()
        if self.started is None:
            self.started = now
            self.deadline = now + self.timeout
            return True
        remaining = self.deadline - now
        if remaining <= 0:
            return False
        await asyncio.sleep(min(self.delay, remaining))  # the last try at the deadline
        self.delay = min(self.delay * 2, _BACKOFF_MAX_S)
        return True

    def waited(self) -> float:
        return 0.0 if self.started is None else asyncio.get_running_loop().time() - self.started


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release hook: nothing to reset. asyncpg has already rolled back any open transaction, and
    statekeel leaves no other session state behind (no LISTEN, cursors outside a transaction, or SET
    beyond the connection's init; the migration lock is unlocked explicitly). Skipping asyncpg's default
    reset query saves one round trip per operation — and behind PgBouncer ``RESET ALL`` would run on some
    other client's server connection."""


async def _rollback(tx: Any) -> None:
    # Best effort: a dead connection has no transaction left to roll back (the server aborted it).
    try:
        await tx.rollback()
    except (*CONNECTION_ERRORS, asyncpg.PostgresError):
        pass


class PostgresBackend(
    PgSchema,
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
    """PostgreSQL storage over an asyncpg pool.

    Each operation borrows a pooled connection for one transaction, so calls from many tasks run in
    parallel (there is no instance-wide lock). Dead connections are replaced by the pool on the next
    acquire: after a server restart the store recovers by itself. Pool sizes and the connect timeout come
    from the URL (``?pool_max_size=20&connect_timeout=5``) or from the keyword arguments, which win.
    """

    def __init__(
        self,
        url: str,
        *,
        codec: Codec,
        min_size: int | None = None,
        max_size: int | None = None,
        connect_timeout: float | None = None,
        migrations: list[Migration] | None = None,
        migrate: bool = True,
    ) -> None:
        super().__init__(url, codec=codec)
        self.migrate = migrate
        self.target = PgTarget(url)
        self._pool: asyncpg.Pool | None = None
        self._min_size = self.target.min_size if min_size is None else min_size
        self._max_size = self.target.max_size if max_size is None else max_size
        if not 0 <= self._min_size <= self._max_size or self._max_size < 1:
            raise InvalidArgument(
                f"pool sizes must satisfy 0 <= min_size <= max_size, max_size >= 1; got min_size "
                f"{self._min_size}, max_size {self._max_size}"
            )
        self._connect_timeout = self.target.connect_timeout if connect_timeout is None else connect_timeout
        self._migrations = migrations if migrations is not None else migrations_shipped()
        self._closed = False

    @property
    def pool(self) -> asyncpg.Pool:
        """The asyncpg pool (for diagnostics and tests; statekeel's writes go through the contract)."""
        return self._require_pool()

    async def _init_connection(self, conn: asyncpg.Connection) -> None:
        await conn.execute("SET TIME ZONE 'UTC'")

    async def initialize(self) -> None:
        if self._pool is not None:
            return
        retries = _Retries(self.target.failover_timeout)
        while self._pool is None:
            try:
                self._pool = await self._create_pool()
            except CONNECTION_ERRORS as exc:
                if self.target.failover_timeout == 0:
                    raise translate(exc, self.target) from None
                # A failover may be under way: wait for a usable server as a call would.
                await self._lost(exc, retries)
        try:
            await self._migrate(self._require_pool())
        except BaseException:
            await self.close()
            raise

    async def _create_pool(self) -> asyncpg.Pool:
        try:
            # asyncpg bounds each connection attempt; the outer deadline also bounds a host list or DNS.
            async with asyncio.timeout(self._connect_timeout * (len(self.target.hosts) + 1) + 1):
                pool: asyncpg.Pool = await asyncpg.create_pool(
                    self.target.dsn,
                    min_size=self._min_size,
                    max_size=self._max_size,
                    timeout=self._connect_timeout,
                    command_timeout=None,
                    statement_cache_size=0 if self.target.pgbouncer else 100,
                    # Behind PgBouncer a session SET would leak to other clients' transactions; and
                    # timestamptz values decode as UTC without it.
                    init=None if self.target.pgbouncer else self._init_connection,
                    reset=_keep_session,
                )
                return pool
        except TimeoutError:
            raise BackendUnavailable(
                f"{self.target} did not answer within the connect timeout ({self._connect_timeout:g} s)",
                **self.target.fields,
            ) from None
        except CONNECTION_ERRORS:
            raise
        except BaseException as exc:
            raise translate(exc, self.target) from None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            try:
                await asyncio.wait_for(self._pool.close(), timeout=10)
            except CONNECTION_ERRORS:
                self._pool.terminate()

    def _require_pool(self) -> asyncpg.Pool:
        if self._pool is None or self._closed:
            raise BackendUnavailable(
                f"store {self.target} is closed" if self._closed else "store not initialized"
            )
        return self._pool

    async def schema_version(self) -> int:
        return max((m.version for m in await self.migrations()), default=0)

    async def migrations(self) -> list[MigrationInfo]:
        pool = self._require_pool()
        try:
            async with pool.acquire() as conn, conn.transaction(readonly=True):
                return await self._applied(conn)
        except BaseException as exc:
            raise translate(exc, self.target) from exc

    async def pending_migrations(self) -> list[tuple[int, str]]:
        todo = pending(await self.migrations(), self._migrations, where=str(self.target))
        return [(m.version, m.name) for m in todo]

    async def integrity_check(self) -> list[str]:
        # PostgreSQL checks its own pages; we verify that our schema is whole.
        problems: list[str] = []
        pool = self._require_pool()
        try:
            async with pool.acquire() as conn, conn.transaction(readonly=True):
                for table in SCHEMA_TABLES:
                    if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table):
                        problems.append(f"table {table} is missing")
        except BaseException as exc:
            raise translate(exc, self.target) from exc
        return problems

    # --- operations -----------------------------------------------------------------------------------

    async def _write(self, op: Op[T], *args: Any) -> T:
        current: PgTx | None = self._current.get()
        if current is not None:
            try:
                # One operation at a time on the block's connection; a savepoint: a failed op leaves
                # nothing behind.
                async with current.lock, current.conn.transaction():
                    return await op(current, *args)
            except BaseException as exc:
                raise translate(exc, self.target) from None
        pool = self._require_pool()
        retries = _Retries(self.target.failover_timeout)
        while True:
            committing = False
            try:
                conn = await pool.acquire()
                failure: BaseException | None = None
                try:
                    # Pinned: a server default of repeatable read would let the audit head and the
                    # conditional updates read a snapshot older than the locks they wait for.
                    tx = conn.transaction(isolation="read_committed")
                    await tx.start()
                    try:
                        result = await op(PgTx(conn, self.codec), *args)
                    except BaseException:
                        await _rollback(tx)
                        raise
                    committing = True
                    await tx.commit()
                    committing = False
                except BaseException as exc:
                    failure = exc
                    raise
                finally:
                    await self._release(pool, conn, failure)
                return result
            except CONNECTION_ERRORS as exc:
                if committing:
                    raise unknown_outcome(exc, self.target) from None
                # Before COMMIT the server rolls back a lost connection's transaction, so running the op
                # again on a fresh connection cannot apply it twice.
                await self._lost(exc, retries)
            except WRONG_NODE_ERRORS as exc:
                if self.target.read_only:
                    raise translate(exc, self.target) from None
                # A demoted primary refused the statement: nothing was committed; find the primary.
                await self._lost(exc, retries)
            except BaseException as exc:
                raise translate(exc, self.target) from None

    async def _write_append(self, *args: Any) -> SessionRecord:
        key, head, messages, metadata, create, *rest = args
        if create or not messages:
            # A session's first save inserts its row first, which the same statement could not update; a
            # save without messages is a metadata change. Both run as before, in a transaction.
            return await super()._write_append(*args)
        write_id = rest[-2]

        async def settle() -> SessionRecord | None:
            # A re-run refused after a lost answer: the row's write id says whether the first run landed
            # (then it is settled as saved); otherwise the outcome stays unknown, never a refusal.
            found = await self.load_session(key)
            if found is None or write_id is None or found.write_id != write_id:
                return None
            if found.head_seq != head + len(messages):
                return None
            log.info("%s: session %r: a save whose answer was lost had landed; settled", self.target, key)
            return found

        return await self._write_statement(
            op_save_in_one_statement, key, head, messages, metadata, *rest, settle=settle
        )

    async def _write_statement(
        self, op: Op[T], *args: Any, settle: Callable[[], Awaitable[T | None]] | None = None
    ) -> T:
        """Run an ``op`` whose write is one statement, on a connection without BEGIN and COMMIT: the
        statement commits on its own (its reads, when it changed nothing, run after it, each on its own).
        A lost connection runs it again on a fresh one, once or as failover allows: the write is
        conditional, so it cannot apply twice, but a second attempt refused (a conflict, a lease taken
        over meanwhile, the row deleted) may have been refused because the first one landed, so any
        refusal of it is unknown, as a lost COMMIT's outcome is — never a definite answer — unless
        ``settle()`` reads that the first run landed (then its result is returned)."""
        if self._current.get() is not None:
            return await self._write(op, *args)
        pool = self._require_pool()
        retries = _Retries(self.target.failover_timeout)
        lost: BaseException | None = None
        while True:
            sent = False
            try:
                conn = await pool.acquire()
                sent = True
                failure: BaseException | None = None
                try:
                    return await op(PgTx(conn, self.codec), *args)
                except BaseException as exc:
                    failure = exc
                    raise
                finally:
                    await self._release(pool, conn, failure)
            except CONNECTION_ERRORS as exc:
                if sent:
                    lost = exc  # the statement may have run and committed
                try:
                    await self._lost(exc, retries)
                except BackendUnavailable:
                    if lost is not None:  # no run heard of: one of them may have landed
                        raise unknown_outcome(lost, self.target) from None
                    raise
            except WRONG_NODE_ERRORS as exc:
                if self.target.read_only:
                    raise translate(exc, self.target) from None
                try:
                    await self._lost(exc, retries)
                except BackendUnavailable:
                    if lost is not None:
                        raise unknown_outcome(lost, self.target) from None
                    raise
            except BaseException as exc:
                refused = translate(exc, self.target)
                if lost is None or not isinstance(
                    refused, ConflictError | LeaseLost | NotFound | InvalidTransition
                ):
                    raise refused from None
                settled = None
                if settle is not None:
                    with suppress(BackendUnavailable):
                        settled = await settle()
                if settled is None:
                    raise unknown_outcome(lost, self.target) from None
                return settled

    async def _lost(self, exc: BaseException, retries: _Retries) -> None:
        """A call met a dead connection or the wrong node: return to run it again, or raise."""
        first = retries.started is None
        if not await retries.again():
            if len(self.target.hosts) > 1 or self.target.failover_timeout > 0:
                raise no_primary(exc, self.target, retries.waited()) from None
            raise translate(exc, self.target) from None
        if first:
            await self._connections_lost(exc)

    async def _connections_lost(self, exc: BaseException) -> None:
        # One dead connection usually means all of them died (server restart, failover,
        # pg_terminate_backend): reconnect every idle one instead of failing on each in turn.
        log.warning("%s: a connection failed (%s); retrying on a new one", self.target, exc)
        busy = isinstance(exc, asyncpg.TooManyConnectionsError | asyncpg.CannotConnectNowError)
        if self._pool is not None and not busy:  # a busy server: fresh connections would not help
            await self._pool.expire_connections()

    async def _release(
        self, pool: asyncpg.Pool, conn: asyncpg.Connection, failure: BaseException | None = None
    ) -> None:
        if isinstance(failure, CONNECTION_ERRORS + WRONG_NODE_ERRORS) or (
            isinstance(failure, asyncio.CancelledError) and conn.is_in_transaction()
        ):
            # Never hand a connection that failed mid-conversation to the next caller: the release
            # hook does not probe it (see _keep_session). A call cancelled inside its transaction (its
            # COMMIT or ROLLBACK may be on the wire) leaves it in the same unknown state. A statement
            # cancelled outside a transaction is cancelled on the server by the pool's release, which
            # waits for the server's answer (it may have committed already: the outcome is the caller's
            # to re-read, as for any cancelled write).
            try:
                conn.terminate()
            except asyncpg.InterfaceError:
                pass  # closed already: asyncpg has returned it to the pool as dead

        try:
            await pool.release(conn)
        except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
            # The pool has already terminated a connection it could not reset; the next acquire opens
            # a new one. The transaction's outcome is settled by now.
            log.warning("%s: dropped a broken connection (%s)", self.target, exc)

    async def _read(self, op: Op[T], *args: Any) -> T:
        if self._current.get() is not None:
            return await self._write(op, *args)
        pool = self._require_pool()
        retries = _Retries(self.target.failover_timeout)
        while True:
            try:
                conn = await pool.acquire()
                failure: BaseException | None = None
                try:
                    async with conn.transaction(isolation="repeatable_read", readonly=True):
                        return await op(PgTx(conn, self.codec), *args)
                except BaseException as exc:
                    failure = exc
                    raise
                finally:
                    await self._release(pool, conn, failure)
            except CONNECTION_ERRORS as exc:
                # A read is safe to run again on a fresh connection.
                await self._lost(exc, retries)
            except BaseException as exc:
                raise translate(exc, self.target) from None

    async def _begin(self, pool: asyncpg.Pool) -> tuple[asyncpg.Connection, Any]:
        """A connection with a started read-committed transaction (pinned, as in _write), for atomic():
        nothing has run in it yet, so a lost connection or a host that refuses is retried as in _write."""
        retries = _Retries(self.target.failover_timeout)
        while True:
            try:
                conn = await pool.acquire()
            except CONNECTION_ERRORS as exc:
                await self._lost(exc, retries)
                continue
            except BaseException as exc:
                raise translate(exc, self.target) from None
            tx = conn.transaction(isolation="read_committed")
            try:
                await tx.start()
                return conn, tx
            except BaseException as exc:
                await self._release(pool, conn, exc)
                if not isinstance(exc, CONNECTION_ERRORS):
                    raise translate(exc, self.target) from None
                await self._lost(exc, retries)

    @asynccontextmanager
    async def atomic(self) -> AsyncIterator[None]:
        if self._current.get() is not None:
            yield
            return
        pool = self._require_pool()
        conn, tx = await self._begin(pool)
        failure: BaseException | None = None
        try:
            with self._outermost_block() as outcome:
                token = self._current.set(PgTx(conn, self.codec))
                try:
                    yield
                except BaseException as exc:
                    self._current.reset(token)
                    failure = exc.__context__ if isinstance(exc, StatekeelError) else exc
                    await _rollback(tx)
                    raise
                self._current.reset(token)
                try:
                    await tx.commit()
                except CONNECTION_ERRORS as exc:
                    # Unknown outcome: taken as not committed, so nothing is assumed written.
                    failure = exc
                    raise unknown_outcome(exc, self.target) from None
                except BaseException as exc:
                    raise translate(exc, self.target) from None
                outcome.committed = True
        finally:
            await self._release(pool, conn, failure)
