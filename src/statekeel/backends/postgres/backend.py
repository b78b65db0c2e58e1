"""PostgreSQL backend (``postgresql://``): many agent instances on many machines share one database.

The same operations as SQLite run on pooled asyncpg connections; there is no instance-wide lock, so
independent calls proceed in parallel and conditional updates (``WHERE head_seq = $n``) do the
serializing. Migrations are serialized across processes with ``pg_advisory_lock``.

URL options (``postgresql://user@host:5432/db?pool_max_size=20``): ``pgbouncer=true`` (no prepared
statement cache, no session state: PgBouncer transaction pooling), ``pool_min_size`` (1),
``pool_max_size`` (10), ``connect_timeout`` (10 s). Anything else goes to asyncpg.

When the server goes away (restart, failover, ``pg_terminate_backend``) calls raise
``BackendUnavailable`` naming host and database, and the pool reconnects by itself. A call that met a
dead connection is retried once on a fresh one — reads always, writes only if COMMIT was not sent yet
(the server rolled the transaction back). A write whose COMMIT got no answer is never retried: it raises
``BackendUnavailable`` with ``outcome="unknown"``, and the caller re-reads (a conditional append then
tells whether it landed).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

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
from ..sql import Op, Row, Tx, load_queries
from ..sql.approvals import SqlApprovals
from ..sql.audit import SqlAudit
from ..sql.copy import SqlCopy
from ..sql.migrations import Migration, load_migrations, pending, refuse_upgrade
from ..sql.sessions import SqlSessions
from ..sql.tasks import SqlTasks
from ..sql.workflows import SqlWorkflows

log = logging.getLogger("statekeel.postgres")

T = TypeVar("T")
# Any constant shared by every statekeel process: the advisory lock that serializes migrations.
MIGRATION_LOCK_ID = 0x5D_7A_7E_4E_E1
CONNECT_TIMEOUT_S = 10.0
DEFAULT_MIN_SIZE = 1
DEFAULT_MAX_SIZE = 10

_SCHEMA_MIGRATIONS_DDL = (
    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
    "name TEXT NOT NULL, checksum TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL)"
)

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

    def ts_in(self, value: dt.datetime) -> Any:
        return value

    def ts_out(self, value: Any) -> dt.datetime:
        result: dt.datetime = value.astimezone(dt.UTC)
        return result


_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
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


class PgTarget:
    """A parsed PostgreSQL URL: the statekeel options it carries, and the parts errors may name.

    Options in the query string, removed before the URL reaches asyncpg: ``pgbouncer=true`` (no prepared
    statement cache, no session state: PgBouncer transaction pooling), ``pool_min_size``,
    ``pool_max_size``, ``connect_timeout`` (seconds). Errors name host, port and database, never the
    password.
    """

    def __init__(self, url: str) -> None:
        if not isinstance(url, str):
            raise InvalidArgument(f"store URL must be a str, got {type(url).__name__}")
        parts = urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres"):
            raise InvalidArgument(f"not a PostgreSQL URL (scheme {parts.scheme!r}); use postgresql://…")
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
        # asyncpg also takes the password from the query string (``?password=…``).
        self._secrets = [s for s in (parts.password, params.get("password")) if s]
        flag = params.pop("pgbouncer", "false").lower()
        if flag not in ("true", "false", "1", "0"):
            raise InvalidArgument(f"pgbouncer must be true or false in a postgresql:// URL, got {flag!r}")
        self.pgbouncer = flag in ("true", "1")
        self.min_size = _int_param(params, "pool_min_size", DEFAULT_MIN_SIZE, minimum=0)
        self.max_size = _int_param(params, "pool_max_size", DEFAULT_MAX_SIZE, minimum=1)
        if self.min_size > self.max_size:
            raise InvalidArgument(
                f"pool_min_size {self.min_size} is larger than pool_max_size {self.max_size}",
                pool_min_size=self.min_size,
                pool_max_size=self.max_size,
            )
        raw_timeout = params.pop("connect_timeout", None)
        self.connect_timeout = CONNECT_TIMEOUT_S
        if raw_timeout is not None:
            try:
                self.connect_timeout = float(raw_timeout)
            except ValueError:
                self.connect_timeout = -1.0
            if not 0 < self.connect_timeout <= 3600:
                raise InvalidArgument(
                    f"connect_timeout must be a number of seconds in (0, 3600], got {raw_timeout!r}"
                )
        hostspec = parts.netloc.rpartition("@")[2]
        try:
            self.host = params.get("host") or parts.hostname or "localhost"
            self.port: int | None = parts.port or 5432
        except ValueError:
            if "," not in hostspec:  # a port that is not a number
                raise InvalidArgument(
                    f"the port in postgresql://{hostspec}/… is not a number (1-65535)"
                ) from None
            self.host, self.port = hostspec, None  # several hosts: asyncpg tries them in turn
        self.database = (parts.path or "/").lstrip("/") or (parts.username or "postgres")
        self.dsn = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(params), ""))

    @property
    def fields(self) -> dict[str, Any]:
        """The error fields naming this server: host, port and database."""
        return {"host": self.host, "port": self.port, "database": self.database}

    def scrub(self, text: str) -> str:
        """``text`` with the URL's password (if any) blanked out."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def __str__(self) -> str:
        where = self.host if self.port is None else f"{self.host}:{self.port}"
        return f"postgresql://{where}/{self.database}"


def _int_param(params: dict[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = params.pop(name, None)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or int(raw) < minimum or int(raw) > 10_000:
        raise InvalidArgument(f"{name} must be an integer in [{minimum}, 10000] in the URL, got {raw!r}")
    return int(raw)


def translate(exc: BaseException, target: PgTarget) -> BaseException:
    """Driver errors → statekeel errors with fields (host and database, never the password)."""
    if isinstance(exc, StatekeelError):
        return exc
    fields = target.fields
    detail = target.scrub(f"{type(exc).__name__}: {exc}")
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
    if isinstance(exc, _CONNECTION_ERRORS):
        return BackendUnavailable(f"{target} is unreachable ({detail})", **fields)
    if isinstance(exc, asyncpg.IntegrityConstraintViolationError):
        return ConflictError(
            f"{target}: constraint failed: {target.scrub(str(exc))}",
            constraint=getattr(exc, "constraint_name", None),
        )
    if isinstance(exc, asyncpg.SerializationError | asyncpg.DeadlockDetectedError):
        return ConflictError(f"{target}: concurrent update ({exc}); retry", sqlstate=exc.sqlstate)
    if isinstance(exc, asyncpg.DataError):
        # SQLSTATE class 22 (and asyncpg's own argument checks): a value PostgreSQL cannot store, e.g.
        # NUL in text or an int out of range. Bad input, not an outage: no retry, no fallback file.
        return InvalidArgument(
            f"{target}: PostgreSQL refused a value ({detail}); nothing was written, fix the value",
            sqlstate=exc.sqlstate,
            **fields,
        )
    if isinstance(exc, asyncpg.UndefinedTableError | asyncpg.UndefinedColumnError):
        return StorageCorrupt(f"{target}: schema is damaged: {exc}", **fields)
    if isinstance(exc, asyncpg.PostgresError):
        return BackendUnavailable(f"{target}: {detail}", sqlstate=exc.sqlstate, **fields)
    return exc


def _unknown_outcome(exc: BaseException, target: PgTarget) -> BackendUnavailable:
    # The COMMIT was sent but its answer never came: the write may or may not be durable. Retrying it
    # blindly could apply it twice, so the caller must re-read and decide.
    return BackendUnavailable(
        f"{target}: the connection was lost while committing ({target.scrub(str(exc))}); the write may or "
        "may not have been applied: re-read before retrying it",
        outcome="unknown",
        **target.fields,
    )


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
    except (*_CONNECTION_ERRORS, asyncpg.PostgresError):
        pass


class PostgresBackend(SqlSessions, SqlCopy, SqlTasks, SqlWorkflows, SqlAudit, SqlApprovals):
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
        try:
            # asyncpg bounds each connection attempt; the outer deadline also bounds a host list or DNS.
            async with asyncio.timeout(self._connect_timeout * 2 + 1):
                self._pool = await asyncpg.create_pool(
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
        except TimeoutError:
            raise BackendUnavailable(
                f"{self.target} did not answer within the connect timeout ({self._connect_timeout:g} s)",
                **self.target.fields,
            ) from None
        except BaseException as exc:
            raise translate(exc, self.target) from None
        try:
            await self._migrate()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            try:
                await asyncio.wait_for(self._pool.close(), timeout=10)
            except _CONNECTION_ERRORS:
                self._pool.terminate()

    def _require_pool(self) -> asyncpg.Pool:
        if self._pool is None or self._closed:
            raise BackendUnavailable(
                f"store {self.target} is closed" if self._closed else "store not initialized"
            )
        return self._pool

    # --- migrations -----------------------------------------------------------------------------------

    async def _applied(self, conn: asyncpg.Connection) -> list[MigrationInfo]:
        exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
        if not exists:
            return []
        rows = await conn.fetch(
            "SELECT version, name, checksum, applied_at FROM schema_migrations ORDER BY version"
        )
        return [MigrationInfo(r[0], r[1], r[2], r[3]) for r in rows]

    async def _migrate(self) -> None:
        pool = self._require_pool()
        try:
            async with pool.acquire() as conn:
                # Cheap path: an up-to-date database needs no lock.
                async with conn.transaction():
                    applied = await self._applied(conn)
                    todo = pending(applied, self._migrations, where=str(self.target))
                    if not todo:
                        return
                    if not self.migrate:
                        refuse_upgrade(todo, applied, where=str(self.target))
                # One transaction per migration, holding the advisory lock until its COMMIT (a session
                # lock would not hold behind PgBouncer's transaction pooling, where each transaction may
                # run on another server connection). _apply's own transaction nests as a savepoint.
                while True:
                    async with conn.transaction():
                        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_ID)
                        # DDL makes the server process pending catalog invalidations: without it this
                        # connection's cached "no schema_migrations" from the cheap path could survive
                        # the wait for the lock, and a migration another process just applied would be
                        # applied again.
                        await conn.execute(_SCHEMA_MIGRATIONS_DDL)
                        todo = pending(await self._applied(conn), self._migrations, where=str(self.target))
                        if not todo:
                            return
                        await self._apply(conn, todo[0])
        except BaseException as exc:
            raise translate(exc, self.target) from exc

    async def _apply(self, conn: asyncpg.Connection, mig: Migration) -> None:
        try:
            async with conn.transaction():
                await conn.execute(_SCHEMA_MIGRATIONS_DDL)
                await conn.execute(mig.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name, checksum, applied_at) "
                    "VALUES ($1, $2, $3, now())",
                    mig.version,
                    mig.name,
                    mig.checksum,
                )
        except asyncpg.PostgresError as exc:
            if isinstance(exc, _CONNECTION_ERRORS):
                raise
            raise MigrationError(
                f"{self.target}: migration {mig.version:04d}_{mig.name} failed: {exc}; "
                "the database is as it was before it",
                version=mig.version,
            ) from exc

    async def schema_version(self) -> int:
        return max((m.version for m in await self.migrations()), default=0)

    async def migrations(self) -> list[MigrationInfo]:
        pool = self._require_pool()
        try:
            async with pool.acquire() as conn, conn.transaction(readonly=True):
                return await self._applied(conn)
        except BaseException as exc:
            raise translate(exc, self.target) from exc

    async def integrity_check(self) -> list[str]:
        # PostgreSQL checks its own pages; we verify that our schema is whole.
        problems: list[str] = []
        pool = self._require_pool()
        try:
            async with pool.acquire() as conn, conn.transaction(readonly=True):
                for table in (
                    "sessions",
                    "messages",
                    "compressions",
                    "message_archive",
                    "workflows",
                    "tasks",
                    "workflow_steps",
                    "task_steps",
                    "audit_log",
                    "approvals",
                ):
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
        for attempt in (1, 2):
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
            except _CONNECTION_ERRORS as exc:
                if committing:
                    raise _unknown_outcome(exc, self.target) from None
                # Before COMMIT the server rolls back a lost connection's transaction, so running the op
                # again on a fresh connection cannot apply it twice.
                if attempt == 2:
                    raise translate(exc, self.target) from None
                await self._connections_lost(exc)
            except BaseException as exc:
                raise translate(exc, self.target) from None
        raise AssertionError("unreachable")

    async def _connections_lost(self, exc: BaseException) -> None:
        # One dead connection usually means all of them died (server restart, failover,
        # pg_terminate_backend): reconnect every idle one instead of failing on each in turn.
        log.warning("%s: a connection failed (%s); retrying once on a new one", self.target, exc)
        busy = isinstance(exc, asyncpg.TooManyConnectionsError | asyncpg.CannotConnectNowError)
        if self._pool is not None and not busy:  # a busy server: fresh connections would not help
            await self._pool.expire_connections()

    async def _release(
        self, pool: asyncpg.Pool, conn: asyncpg.Connection, failure: BaseException | None = None
    ) -> None:
        if isinstance(failure, _CONNECTION_ERRORS):
            # Never hand a connection that failed mid-conversation to the next caller: the release
            # hook does not probe it (see _keep_session).
            try:
                conn.terminate()
            except asyncpg.InterfaceError:
                pass  # closed already: asyncpg has returned it to the pool as dead

        try:
            await pool.release(conn)
        except (*_CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
            # The pool has already terminated a connection it could not reset; the next acquire opens
            # a new one. The transaction's outcome is settled by now.
            log.warning("%s: dropped a broken connection (%s)", self.target, exc)

    async def _read(self, op: Op[T], *args: Any) -> T:
        if self._current.get() is not None:
            return await self._write(op, *args)
        pool = self._require_pool()
        for attempt in (1, 2):
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
            except _CONNECTION_ERRORS as exc:
                # A read is safe to retry once on a fresh connection.
                if attempt == 2:
                    raise translate(exc, self.target) from None
                await self._connections_lost(exc)
            except BaseException as exc:
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
        failure: BaseException | None = None
        try:
            tx = conn.transaction(isolation="read_committed")  # pinned, as in _write
            try:
                await tx.start()
            except BaseException as exc:
                failure = exc
                raise translate(exc, self.target) from None
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
                except _CONNECTION_ERRORS as exc:
                    # Unknown outcome: taken as not committed, so nothing is assumed written.
                    failure = exc
                    raise _unknown_outcome(exc, self.target) from None
                except BaseException as exc:
                    raise translate(exc, self.target) from None
                outcome.committed = True
        finally:
            await self._release(pool, conn, failure)
