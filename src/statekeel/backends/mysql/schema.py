"""The MySQL/MariaDB schema: numbered migrations, serialized across processes by a named lock.

DDL is not transactional in MySQL or MariaDB: each statement commits by itself. So every migration file is
written to be run again from its start — ``CREATE TABLE IF NOT EXISTS``, ``ADD COLUMN IF NOT EXISTS``,
``CREATE INDEX IF NOT EXISTS``, ``CREATE OR REPLACE TRIGGER``, idempotent updates — and is recorded in
``schema_migrations`` (version, name, checksum) only once all of its statements have completed. A process
killed half way through one leaves it unrecorded; the next open runs it again from the start, which finishes
the part that was missing and changes nothing that was there.

The named lock (``GET_LOCK``) is a session lock, not a transaction lock: it stays held across the implicit
commits of the DDL, and the server releases it if the process dies.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from asyncmy import errors as my

from ...errors import MigrationError
from ..base import MigrationInfo
from ..sql.migrations import Migration, pending, refuse_upgrade
from .errors import is_connection_error, translate
from .target import MyTarget

MIGRATION_LOCK_TIMEOUT_S = 120

_SCHEMA_MIGRATIONS_DDL = (
    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
    "name VARCHAR(128) NOT NULL, checksum CHAR(64) NOT NULL, applied_at DATETIME(6) NOT NULL) "
    "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
)
_COMPOUND = ("CREATE TRIGGER", "CREATE OR REPLACE TRIGGER", "CREATE PROCEDURE", "CREATE FUNCTION")

# Tests only: called after each statement of a migration as (version, statement index).
statement_hook: Callable[[int, int], None] | None = None


def migration_statements(sql: str) -> list[str]:
    """The statements of a migration file in order. A statement ends with ``;`` at the end of a line; a
    trigger's body (``BEGIN`` … ``END;`` on a line of its own) is kept whole."""
    statements: list[str] = []
    current: list[str] = []
    for line in sql.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("--")):
            continue
        current.append(line)
        head = " ".join(" ".join(current).split()).upper()
        compound = head.startswith(_COMPOUND)
        if (compound and stripped == "END;") or (not compound and stripped.endswith(";")):
            text = "\n".join(current).strip()
            statements.append(text[:-1].rstrip())
            current = []
    if any(line.strip() and not line.strip().startswith("--") for line in current):
        raise RuntimeError(f"a migration statement does not end with ';': {' '.join(current)[:200]}")
    return statements


class MySchema:
    """The schema half of :class:`~statekeel.backends.mysql.backend.MySqlBackend`."""

    target: MyTarget
    migrate: bool
    _migrations: list[Migration]

    async def _applied(self, conn: Any) -> list[MigrationInfo]:
        async with conn.cursor() as cur:
            await cur.execute(
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() "
                "AND table_name = 'schema_migrations'"
            )
            (exists,) = await cur.fetchone()
            if not exists:
                return []
            await cur.execute(
                "SELECT version, name, checksum, applied_at FROM schema_migrations ORDER BY version"
            )
            rows = await cur.fetchall()
        return [MigrationInfo(r[0], r[1], r[2], r[3].replace(tzinfo=dt.UTC)) for r in rows]

    async def _migrate(self, conn: Any) -> None:
        try:
            applied = await self._applied(conn)
            await conn.commit()
            todo = pending(applied, self._migrations, where=str(self.target))
            if not todo:
                return
            if not self.migrate:
                refuse_upgrade(todo, applied, where=str(self.target))
            async with conn.cursor() as cur:
                await cur.execute(
                    "SELECT GET_LOCK(CONCAT('statekeel.migrate:', DATABASE()), %s)",
                    [MIGRATION_LOCK_TIMEOUT_S],
                )
                (got,) = await cur.fetchone()
                if got != 1:
                    raise MigrationError(
                        f"{self.target}: another process has been migrating this database for over "
                        f"{MIGRATION_LOCK_TIMEOUT_S} s; nothing was changed. Open it again once that process "
                        "has finished (or died: the server then frees its lock)",
                        hint="",
                    )
                try:
                    await cur.execute(_SCHEMA_MIGRATIONS_DDL)
                    todo = pending(await self._applied(conn), self._migrations, where=str(self.target))
                    for mig in todo:
                        await self._apply(conn, cur, mig)
                finally:
                    try:
                        await cur.execute("SELECT RELEASE_LOCK(CONCAT('statekeel.migrate:', DATABASE()))")
                        await cur.fetchall()
                    except (my.MySQLError, ConnectionError, OSError):
                        pass  # a dead session has released it already
        except BaseException as exc:
            raise translate(exc, self.target) from exc

    async def _apply(self, conn: Any, cur: Any, mig: Migration) -> None:
        for index, statement in enumerate(migration_statements(mig.sql)):
            try:
                await cur.execute(statement.replace("%", "%%"), [])
            except my.MySQLError as exc:
                if is_connection_error(exc):
                    raise
                raise MigrationError(
                    f"{self.target}: migration {mig.version:04d}_{mig.name} failed at its statement "
                    f"{index + 1}: {exc}. DDL is not transactional on MySQL/MariaDB: the statements before "
                    "it are applied, and the migration is not recorded; fix the cause and open the store "
                    "again, which runs it again from its start (each statement is safe to repeat)",
                    version=mig.version,
                    hint="",
                ) from exc
            if statement_hook is not None:
                statement_hook(mig.version, index)
        await cur.execute(
            "INSERT INTO schema_migrations (version, name, checksum, applied_at) "
            "VALUES (%s, %s, %s, UTC_TIMESTAMP(6))",
            [mig.version, mig.name, mig.checksum],
        )
        await conn.commit()
