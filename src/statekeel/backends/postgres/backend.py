"""PostgreSQL backend (``postgresql://``): many agent instances on many machines share one database.

The same operations as SQLite run on pooled asyncpg connections; there is no instance-wide lock, so
independent calls proceed in parallel and conditional updates (``WHERE head_seq = $n``) do the
serializing. ``?pgbouncer=true`` in the URL turns off the prepared-statement cache for PgBouncer's
transaction pooling. Migrations are serialized across processes with ``pg_advisory_lock``.
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
from ..sql.migrations import Migration, load_migrations, pending
from ..sql.sessions import SqlSessions

log = logging.getLogger("statekeel.postgres")

T = TypeVar("T")
# Any constant shared by every statekeel process: the advisory lock that serializes migrations.
MIGRATION_LOCK_ID = 0x5D_7A_7E_4E_E1
CONNECT_TIMEOUT_S = 10.0

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
    __slots__ = ("codec", "conn", "sql")

    def __init__(self, conn: asyncpg.Connection, codec: Codec) -> None:
        self.conn = conn
        self.codec = codec
        self.sql = queries()

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
    ConnectionError,
    OSError,
    TimeoutError,
)


class PgTarget:
    """The parts of a PostgreSQL URL that errors may name (never the password)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres"):
            raise InvalidArgument(f"not a PostgreSQL URL: {url!r}")
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
        flag = params.pop("pgbouncer", "false").lower()
        if flag not in ("true", "false", "1", "0"):
            raise InvalidArgument(f"pgbouncer must be true or false in {parts.scheme}:// URL, got {flag!r}")
        self.pgbouncer = flag in ("true", "1")
        self.host = parts.hostname or "localhost"
        self.port = parts.port or 5432
        self.database = (parts.path or "/").lstrip("/") or (parts.username or "postgres")
        self.dsn = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(params), ""))

    def __str__(self) -> str:
        return f"postgresql://{self.host}:{self.port}/{self.database}"


def translate(exc: BaseException, target: PgTarget) -> BaseException:
    """Driver errors → statekeel errors with fields (host and database, never the password)."""
    if isinstance(exc, StatekeelError):
        return exc
    if isinstance(exc, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError):
        return BackendUnavailable(
            f"{target}: authentication failed ({type(exc).__name__})",
            host=target.host,
            database=target.database,
        )
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return BackendUnavailable(
            f"{target}: database {target.database!r} does not exist",
            host=target.host,
            database=target.database,
        )
    if isinstance(exc, _CONNECTION_ERRORS):
        return BackendUnavailable(
            f"{target} is unreachable: {type(exc).__name__}: {exc}",
            host=target.host,
            database=target.database,
        )
    if isinstance(exc, asyncpg.IntegrityConstraintViolationError):
        return ConflictError(
            f"{target}: constraint failed: {exc}", constraint=getattr(exc, "constraint_name", None)
        )
    if isinstance(exc, asyncpg.SerializationError | asyncpg.DeadlockDetectedError):
        return ConflictError(f"{target}: concurrent update ({exc}); retry", sqlstate=exc.sqlstate)
    if isinstance(exc, asyncpg.UndefinedTableError | asyncpg.UndefinedColumnError):
        return StorageCorrupt(
            f"{target}: schema is damaged: {exc}", host=target.host, database=target.database
        )
    if isinstance(exc, asyncpg.PostgresError):
        return BackendUnavailable(
            f"{target}: {type(exc).__name__}: {exc}",
            host=target.host,
            database=target.database,
            sqlstate=exc.sqlstate,
        )
    return exc


class PostgresBackend(SqlSessions):
    """PostgreSQL storage over an asyncpg pool."""

    def __init__(
        self,
        url: str,
        *,
        codec: Codec,
        min_size: int = 1,
        max_size: int = 10,
        migrations: list[Migration] | None = None,
    ) -> None:
        super().__init__(url, codec=codec)
        self.target = PgTarget(url)
        self._pool: asyncpg.Pool | None = None
        self._min_size = min_size
        self._max_size = max_size
        self._migrations = migrations if migrations is not None else migrations_shipped()
        self._closed = False

    async def _init_connection(self, conn: asyncpg.Connection) -> None:
        await conn.execute("SET TIME ZONE 'UTC'")

    async def initialize(self) -> None:
        if self._pool is not None:
            return
        try:
            self._pool = await asyncpg.create_pool(
                self.target.dsn,
                min_size=self._min_size,
                max_size=self._max_size,
                timeout=CONNECT_TIMEOUT_S,
                command_timeout=None,
                statement_cache_size=0 if self.target.pgbouncer else 100,
                init=self._init_connection,
            )
        except BaseException as exc:
            raise translate(exc, self.target) from exc
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
                if not pending(await self._applied(conn), self._migrations, where=str(self.target)):
                    return
                await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_ID)
                try:
                    for mig in pending(await self._applied(conn), self._migrations, where=str(self.target)):
                        await self._apply(conn, mig)
                finally:
                    await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_ID)
        except BaseException as exc:
            raise translate(exc, self.target) from exc

    async def _apply(self, conn: asyncpg.Connection, mig: Migration) -> None:
        try:
            async with conn.transaction():
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
                    "name TEXT NOT NULL, checksum TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL)"
                )
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
            async with pool.acquire() as conn:
                return await self._applied(conn)
        except BaseException as exc:
            raise translate(exc, self.target) from exc

    async def integrity_check(self) -> list[str]:
        # PostgreSQL checks its own pages; we verify that our schema is whole.
        problems: list[str] = []
        pool = self._require_pool()
        try:
            async with pool.acquire() as conn:
                for table in ("sessions", "messages", "compressions", "message_archive"):
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
                async with current.conn.transaction():  # a savepoint: a failed op leaves nothing behind
                    return await op(current, *args)
            except BaseException as exc:
                raise translate(exc, self.target) from None
        pool = self._require_pool()
        try:
            async with pool.acquire() as conn, conn.transaction():
                return await op(PgTx(conn, self.codec), *args)
        except BaseException as exc:
            raise translate(exc, self.target) from None

    async def _read(self, op: Op[T], *args: Any) -> T:
        if self._current.get() is not None:
            return await self._write(op, *args)
        pool = self._require_pool()
        for attempt in (1, 2):
            try:
                async with (
                    pool.acquire() as conn,
                    conn.transaction(isolation="repeatable_read", readonly=True),
                ):
                    return await op(PgTx(conn, self.codec), *args)
            except _CONNECTION_ERRORS as exc:
                # A read is safe to retry once on a fresh connection (the pool drops the dead one).
                if attempt == 2:
                    raise translate(exc, self.target) from None
                log.warning("%s: read failed on a dead connection (%s); retrying once", self.target, exc)
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
        try:
            tx = conn.transaction()
            try:
                await tx.start()
            except BaseException as exc:
                raise translate(exc, self.target) from None
            token = self._current.set(PgTx(conn, self.codec))
            try:
                yield
            except BaseException:
                self._current.reset(token)
                try:
                    await tx.rollback()
                except _CONNECTION_ERRORS:
                    pass
                raise
            self._current.reset(token)
            try:
                await tx.commit()
            except BaseException as exc:
                raise translate(exc, self.target) from None
        finally:
            await pool.release(conn)
