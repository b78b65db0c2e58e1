"""The PostgreSQL schema: migrations, serialized across processes and applied one per transaction."""

from __future__ import annotations

import asyncpg

from ...errors import MigrationError
from ..base import MigrationInfo
from ..sql.migrations import Migration, pending, refuse_upgrade
from .errors import CONNECTION_ERRORS, translate
from .target import PgTarget

# Any constant shared by every statekeel process: the advisory lock that serializes migrations.
MIGRATION_LOCK_ID = 0x5D_7A_7E_4E_E1

_SCHEMA_MIGRATIONS_DDL = (
    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
    "name TEXT NOT NULL, checksum TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL)"
)


class PgSchema:
    """The schema half of :class:`~statekeel.backends.postgres.backend.PostgresBackend`."""

    target: PgTarget
    migrate: bool
    _migrations: list[Migration]

    async def _applied(self, conn: asyncpg.Connection) -> list[MigrationInfo]:
        exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
        if not exists:
            return []
        rows = await conn.fetch(
            "SELECT version, name, checksum, applied_at FROM schema_migrations ORDER BY version"
        )
        return [MigrationInfo(r[0], r[1], r[2], r[3]) for r in rows]

    async def _migrate(self, pool: asyncpg.Pool) -> None:
        try:
            async with pool.acquire() as conn:
                # Cheap path: an up-to-date database needs no lock. Read committed, whatever the server's
                # or database's default_transaction_isolation: see below.
                async with conn.transaction(isolation="read_committed"):
                    applied = await self._applied(conn)
                    todo = pending(applied, self._migrations, where=str(self.target))
                    if not todo:
                        return
                    if self.target.read_only:  # it may be a standby: it cannot be migrated
                        raise MigrationError(
                            f"{self.target} needs {len(todo)} migration(s) and was opened with "
                            f"target_session_attrs={self.target.session_attrs} (read-only); nothing was "
                            "changed: open it once with target_session_attrs=read-write to upgrade it",
                            pending=[m.version for m in todo],
                            hint="",
                        )
                    if not self.migrate:
                        refuse_upgrade(todo, applied, where=str(self.target))
                # One transaction per migration, holding the advisory lock until its COMMIT (a session
                # lock would not hold behind PgBouncer's transaction pooling, where each transaction may
                # run on another server connection). _apply's own transaction nests as a savepoint.
                # Read committed, explicitly: under a default of repeatable read or serializable the
                # transaction's snapshot would be taken by the statement that waits for the lock, so a
                # process that waited for another's migration would not see it and apply it again.
                while True:
                    async with conn.transaction(isolation="read_committed"):
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
            if isinstance(exc, CONNECTION_ERRORS):
                raise
            raise MigrationError(
                f"{self.target}: migration {mig.version:04d}_{mig.name} failed: {exc}. The database is as "
                "it was before this migration; fix the cause and open it again",
                version=mig.version,
                hint="",
            ) from exc
