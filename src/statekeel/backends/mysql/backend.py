"""MySQL / MariaDB backend (``mysql://``, ``mariadb://``): the same operations on a pooled asyncmy driver.

Like PostgreSQL there is no instance-wide lock: calls run in parallel on pooled connections and the
conditional updates (``WHERE head_seq = $n``) serialize writers. Write transactions run at READ COMMITTED
(those updates and the audit head must read the latest committed row, not a snapshot older than the locks
they waited for); reads run in a REPEATABLE READ, read-only transaction: one consistent snapshot. Tables are
InnoDB, text is utf8mb4 with the ``utf8mb4_bin`` collation (case-sensitive, byte order like the other
dialects). Claims use ``SELECT … FOR UPDATE SKIP LOCKED`` (MariaDB ≥ 10.6, MySQL ≥ 8.0).

Failures: a call that met a dead connection is retried once on a new one — reads always, writes only if
COMMIT was not sent (the server rolled the transaction back). A write whose COMMIT got no answer raises
``BackendUnavailable`` with ``outcome="unknown"``. A deadlock (the server rolled the whole transaction back)
is retried once, then raises ``ConflictError``; an unconditional write (marked
:func:`~statekeel.backends.sql.unconditional`: a memory put or forget) is retried up to 8 times with a
growing pause. Values too large for the server's ``max_allowed_packet``
raise ``PayloadTooLarge`` before anything is sent.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import asyncmy
from asyncmy.constants import CLIENT

from ...codec import Codec
from ...errors import BackendUnavailable, ConflictError, InvalidArgument, StatekeelError
from ..base import MigrationInfo
from ..sql import SCHEMA_TABLES, Op, is_unconditional
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
from ..sql.schedules import SqlSchedules
from ..sql.sessions import SqlSessions
from ..sql.tasks import SqlTasks
from ..sql.tool_calls import SqlToolCalls
from ..sql.traces import SqlTraces
from ..sql.vectors import SqlVectors
from ..sql.workflows import SqlWorkflows
from .errors import (
    ER_LOCK_DEADLOCK,
    is_connection_error,
    is_deadlock,
    target_detail,
    translate,
    unknown_outcome,
)
from .queries import Script, load_scripts
from .schema import MySchema
from .target import MyTarget
from .tx import MyTx

__all__ = ["MySqlBackend", "MyTarget", "MyTx", "migrations_shipped", "scripts"]

log = logging.getLogger("statekeel.mysql")

T = TypeVar("T")

_SCRIPTS: dict[str, Script] | None = None

# Every session: UTC timestamps, strict values (an over-long value is an error, never truncated), no
# practical limit on GROUP_CONCAT / JSON_ARRAYAGG results.
_INIT = (
    "SET time_zone = '+00:00', group_concat_max_len = 4294967295, sql_mode = "
    "'STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ZERO_DATE,NO_ZERO_IN_DATE,NO_ENGINE_SUBSTITUTION'"
)
_BEGIN_WRITE = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION"
_BEGIN_READ = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; START TRANSACTION READ ONLY"
# An unconditional write chosen as a deadlock victim runs again up to this many times, pausing
# _deadlock_pause(n) before the n-th: about 1 s in all before its ConflictError.
_UNCONDITIONAL_DEADLOCK_RETRIES = 8


def _deadlock_pause(retry: int) -> float:
    # Doubling from 5 ms up to 320 ms, with jitter so two victims of one cycle do not meet again in step.
    base: float = min(0.005 * 2.0 ** (retry - 1), 0.32)
    return base * (0.5 + random.random())


def scripts() -> dict[str, Script]:
    """The dialect's named queries, compiled for the driver."""
    global _SCRIPTS
    if _SCRIPTS is None:
        _SCRIPTS = load_scripts(__package__ or "statekeel.backends.mysql")
    return _SCRIPTS


def migrations_shipped() -> list[Migration]:
    return load_migrations("statekeel.backends.mysql.migrations")


async def _begin(conn: Any, sql: str) -> None:
    async with conn.cursor() as cur:
        await cur.execute(sql)
        while await cur.nextset():
            pass


class MySqlBackend(
    MySchema,
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
    """MySQL/MariaDB storage over an asyncmy pool (see the module docstring)."""

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
        self.target = MyTarget(url)
        self._pool: Any = None
        self._min_size = self.target.min_size if min_size is None else min_size
        self._max_size = self.target.max_size if max_size is None else max_size
        if not 0 <= self._min_size <= self._max_size or self._max_size < 1:
            raise InvalidArgument(
                f"pool sizes must satisfy 0 <= min_size <= max_size, max_size >= 1; got min_size "
                f"{self._min_size}, max_size {self._max_size}"
            )
        self._connect_timeout = self.target.connect_timeout if connect_timeout is None else connect_timeout
        self._migrations = migrations if migrations is not None else migrations_shipped()
        self._scripts = scripts()
        self._closed = False
        self.max_packet = 16 * 1024 * 1024

    def _connect_kwargs(self) -> dict[str, Any]:
        kwargs = self.target.connect_kwargs()
        kwargs.update(
            connect_timeout=self._connect_timeout,
            charset="utf8mb4",
            autocommit=False,
            # Row counts of UPDATE are rows matched, as on the other dialects (not only rows changed).
            client_flag=CLIENT.FOUND_ROWS | CLIENT.MULTI_STATEMENTS,
            init_command=_INIT,
        )
        return kwargs

    @property
    def pool(self) -> Any:
        """The asyncmy pool (for diagnostics and tests; statekeel's writes go through the contract)."""
        return self._require_pool()

    async def initialize(self) -> None:
        if self._pool is not None:
            return
        try:
            async with asyncio.timeout(self._connect_timeout * 2 + 1):
                self._pool = await asyncmy.create_pool(
                    minsize=self._min_size,
                    maxsize=self._max_size,
                    pool_recycle=3600,
                    **self._connect_kwargs(),
                )
        except TimeoutError:
            raise BackendUnavailable(
                f"{self.target} did not answer within the connect timeout ({self._connect_timeout:g} s)",
                **self.target.fields,
            ) from None
        except BaseException as exc:
            raise translate(exc, self.target) from None
        try:
            conn = await self._pool.acquire()
            try:
                async with conn.cursor() as cur:
                    await cur.execute("SELECT @@max_allowed_packet, VERSION()")
                    packet, version = await cur.fetchone()
                self.max_packet = int(packet)
                self.server_version = str(version)
                await conn.commit()
                await self._migrate(conn)
            finally:
                self._pool.release(conn)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.close()
            try:
                await asyncio.wait_for(self._pool.wait_closed(), timeout=10)
            except (TimeoutError, OSError, ConnectionError):
                self._pool.terminate()

    def _require_pool(self) -> Any:
        if self._pool is None or self._closed:
            raise BackendUnavailable(
                f"store {self.target} is closed" if self._closed else "store not initialized"
            )
        return self._pool

    async def schema_version(self) -> int:
        return max((m.version for m in await self.migrations()), default=0)

    async def migrations(self) -> list[MigrationInfo]:
        async def op(tx: MyTx) -> list[MigrationInfo]:
            return await self._applied(tx.conn)

        return await self._read(op)

    async def pending_migrations(self) -> list[tuple[int, str]]:
        todo = pending(await self.migrations(), self._migrations, where=str(self.target))
        return [(m.version, m.name) for m in todo]

    async def integrity_check(self) -> list[str]:
        async def op(tx: MyTx) -> set[str]:
            async with tx.conn.cursor() as cur:
                await cur.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()"
                )
                return {str(r[0]) for r in await cur.fetchall()}

        present = await self._read(op)
        return [f"table {t} is missing" for t in SCHEMA_TABLES if t not in present]

    # --- operations -----------------------------------------------------------------------------------

    def _tx(self, conn: Any) -> MyTx:
        return MyTx(conn, self.codec, self._scripts, self.max_packet)

    async def _write(self, op: Op[T], *args: Any) -> T:
        current: MyTx | None = self._current.get()
        if current is not None:
            return await self._write_nested(current, op, *args)
        pool = self._require_pool()
        lost = False
        deadlocks = 0
        unconditional = is_unconditional(op)
        while True:
            committing = False
            conn = None
            try:
                conn = await pool.acquire()
                try:
                    await _begin(conn, _BEGIN_WRITE)
                    result = await op(self._tx(conn), *args)
                    committing = True
                    await conn.commit()
                    return result
                except BaseException as exc:
                    await self._end_failed(conn, exc, committing)
                    raise
                finally:
                    pool.release(conn)
            except BaseException as exc:
                if is_connection_error(exc):
                    if committing:
                        raise unknown_outcome(exc, self.target) from None
                    # Before COMMIT the server rolls back a lost connection's transaction: running the op
                    # again on a new connection cannot apply it twice.
                    if lost or conn is None:
                        raise translate(exc, self.target) from None
                    lost = True
                    log.warning("%s: a connection failed (%s); retrying once on a new one", self.target, exc)
                    await self._drop_idle()
                    continue
                if is_deadlock(exc):
                    # InnoDB rolled the whole transaction back: running it again cannot apply it twice. A
                    # conditional write runs once more, then its caller re-reads; an unconditional one
                    # goes on (each victim's rival has committed meanwhile), with a growing pause.
                    limit = _UNCONDITIONAL_DEADLOCK_RETRIES if unconditional else 1
                    if deadlocks < limit:
                        deadlocks += 1
                        log.info("%s: deadlock (%s); retry %d of %d", self.target, exc, deadlocks, limit)
                        if unconditional:
                            await asyncio.sleep(_deadlock_pause(deadlocks))
                        continue
                    if unconditional:
                        raise ConflictError(
                            f"{self.target}: chosen as a deadlock victim {deadlocks + 1} times in a row "
                            f"({target_detail(exc, self.target)}); nothing was written: call again",
                            code=ER_LOCK_DEADLOCK,
                            attempts=deadlocks + 1,
                            hint="",
                        ) from None
                raise translate(exc, self.target) from None

    async def _end_failed(self, conn: Any, exc: BaseException, committing: bool) -> None:
        """Roll back after a failure; a connection in an unknown state is closed, never pooled again."""
        if is_connection_error(exc) or committing or isinstance(exc, asyncio.CancelledError):
            conn.close()
            return
        try:
            await conn.rollback()
        except BaseException:
            conn.close()

    async def _drop_idle(self) -> None:
        # One dead connection usually means all of them died (a server restart): drop the idle ones.
        if self._pool is not None:
            try:
                await self._pool.clear()
            except (OSError, ConnectionError, asyncmy.errors.MySQLError):
                pass

    async def _write_nested(self, current: MyTx, op: Op[T], *args: Any) -> T:
        if current.broken is not None:
            raise current.broken
        async with current.lock:
            try:
                async with current.conn.cursor() as cur:
                    await cur.execute("SAVEPOINT statekeel_op")
                try:
                    result = await op(current, *args)
                except BaseException as exc:
                    if not (is_connection_error(exc) or is_deadlock(exc)):
                        # (After a deadlock the server has rolled back the whole transaction, savepoint
                        # and all: there is nothing to roll back to.)
                        async with current.conn.cursor() as cur:
                            await cur.execute("ROLLBACK TO SAVEPOINT statekeel_op")
                    raise
                async with current.conn.cursor() as cur:
                    await cur.execute("RELEASE SAVEPOINT statekeel_op")
                return result
            except BaseException as exc:
                out = translate(exc, self.target)
                if is_connection_error(exc) or is_deadlock(exc):
                    # The server ended the whole transaction: the block can only roll back now.
                    current.broken = out if isinstance(out, StatekeelError) else ConflictError(str(out))
                raise out from None

    async def _read(self, op: Op[T], *args: Any) -> T:
        if self._current.get() is not None:
            return await self._write(op, *args)
        pool = self._require_pool()
        for attempt in (1, 2):
            conn = None
            try:
                conn = await pool.acquire()
                try:
                    await _begin(conn, _BEGIN_READ)
                    result = await op(self._tx(conn), *args)
                    await conn.commit()
                    return result
                except BaseException as exc:
                    await self._end_failed(conn, exc, False)
                    raise
                finally:
                    pool.release(conn)
            except BaseException as exc:
                if is_connection_error(exc) and attempt == 1 and conn is not None:
                    await self._drop_idle()
                    continue
                raise translate(exc, self.target) from None
        raise AssertionError("unreachable")

    @asynccontextmanager
    async def atomic(self) -> AsyncIterator[None]:
        if self._current.get() is not None:
            yield
            return
        pool = self._require_pool()
        try:
            conn = await pool.acquire()
        except BaseException as exc:
            raise translate(exc, self.target) from None
        try:
            try:
                await _begin(conn, _BEGIN_WRITE)
            except BaseException as exc:
                conn.close()
                raise translate(exc, self.target) from None
            with self._outermost_block() as outcome:
                tx = self._tx(conn)
                token = self._current.set(tx)
                try:
                    yield
                except BaseException as exc:
                    self._current.reset(token)
                    await self._end_failed(conn, exc, False)
                    raise
                self._current.reset(token)
                if tx.broken is not None:
                    await self._end_failed(conn, tx.broken, False)
                    raise tx.broken
                try:
                    await conn.commit()
                except BaseException as exc:
                    conn.close()
                    if is_connection_error(exc):
                        raise unknown_outcome(exc, self.target) from None
                    raise translate(exc, self.target) from None
                outcome.committed = True
        finally:
            pool.release(conn)
