"""Invariant 8 on MariaDB, where DDL is not transactional: a migration killed half way is unrecorded and
runs again from its start on the next open, which finishes it; concurrent openers (serialized by a named
lock) all succeed and each migration is recorded once; a failed migration records nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from migration_support import open_concurrently

import statekeel
from conftest import my_admin
from statekeel.backends.mysql.backend import MySqlBackend, migrations_shipped
from statekeel.backends.mysql.schema import migration_statements
from statekeel.backends.sql.migrations import Migration
from statekeel.codec import Codec

SHIPPED = migrations_shipped()
CURRENT = len(SHIPPED)


def _schema(database: str) -> dict[str, str]:
    """Every table's and trigger's definition in ``database`` (AUTO_INCREMENT counters left out)."""
    tables = my_admin(f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{database}'")
    out = {}
    for (table,) in tables:
        ddl = my_admin(f"SHOW CREATE TABLE `{database}`.`{table}`")[0][1]
        out[f"table {table}"] = " ".join(w for w in ddl.split() if not w.startswith("AUTO_INCREMENT="))
    for name, statement in my_admin(
        "SELECT trigger_name, action_statement FROM information_schema.triggers "
        f"WHERE trigger_schema = '{database}'"
    ):
        out[f"trigger {name}"] = statement
    return out


def _versions(database: str) -> list[int]:
    return [r[0] for r in my_admin(f"SELECT version FROM `{database}`.schema_migrations ORDER BY version")]


_KILL_HALF_WAY = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    import statekeel
    from statekeel.backends.mysql import schema

    version, index = int(sys.argv[2]), int(sys.argv[3])

    def hook(v, i):
        if (v, i) == (version, index):
            os.kill(os.getpid(), signal.SIGKILL)

    schema.statement_hook = hook

    async def main():
        await statekeel.open_store(sys.argv[1])

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("version", [1, 4, 7, 8, 9])
def test_a_migration_killed_half_way_is_unrecorded_and_finished_by_the_next_open(
    my_database: str, my_template: tuple[str, list[str]], version: int
) -> None:
    database = my_database.rsplit("/", 1)[1]
    half = len(migration_statements(SHIPPED[version - 1].sql)) // 2
    done = subprocess.run(
        [sys.executable, "-c", _KILL_HALF_WAY, my_database, str(version), str(half)],
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == -9, done.stderr.decode()
    assert _versions(database) == list(range(1, version))  # the killed one is not recorded

    async def reopen() -> int:
        async with statekeel.open_store(my_database) as store:
            return (await store.info()).schema_version

    import asyncio

    assert asyncio.run(reopen()) == CURRENT
    assert _versions(database) == list(range(1, CURRENT + 1))
    assert _schema(database) == _schema(my_template[0])


def test_every_migration_is_safe_to_run_twice(my_database: str, my_template: tuple[str, list[str]]) -> None:
    import asyncio

    database = my_database.rsplit("/", 1)[1]

    async def run_all_twice() -> None:
        async with statekeel.open_store(my_database):
            pass
        # Forget that they ran: the next open runs every file again over the finished schema.
        my_admin(f"DELETE FROM `{database}`.schema_migrations")
        async with statekeel.open_store(my_database) as store:
            assert (await store.info()).schema_version == CURRENT

    asyncio.run(run_all_twice())
    assert _schema(database) == _schema(my_template[0])


async def test_a_failed_migration_is_not_recorded_and_says_which_statement(my_migrated: str) -> None:
    database = my_migrated.rsplit("/", 1)[1]
    broken = Migration(
        CURRENT + 1,
        "broken",
        "CREATE TABLE IF NOT EXISTS added_by_broken (a INTEGER);\nSELECT * FROM no_such_table;\n",
    )
    backend = MySqlBackend(my_migrated, codec=Codec(), migrations=[*SHIPPED, broken])
    with pytest.raises(statekeel.MigrationError, match="statement 2") as info:
        await backend.initialize()
    assert info.value.fields["version"] == CURRENT + 1
    assert _versions(database) == list(range(1, CURRENT + 1))
    async with statekeel.open_store(my_migrated) as store:
        assert (await store.info()).schema_version == CURRENT


def test_concurrent_openers_of_a_new_database_all_succeed_and_record_each_migration_once(
    my_database: str,
) -> None:
    outputs = open_concurrently(my_database, 4, timeout=180)
    assert len(outputs) == 4
    database = my_database.rsplit("/", 1)[1]
    assert _versions(database) == list(range(1, CURRENT + 1))
