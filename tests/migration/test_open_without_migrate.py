"""``open_store(url, migrate=False)``: inspect a store without ever upgrading it.

A newer statekeel that upgrades a shared store (``statekeel info`` run against production, say) would make
every older agent refuse it with SchemaTooNew. With ``migrate=False`` a store with pending migrations is
refused with MigrationError and left exactly as it was.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner

import statekeel
from statekeel.cli import main

FIXTURES = Path(__file__).parent / "fixtures"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _copy_v1(tmp_path: Path) -> Path:
    target = tmp_path / "v1.sqlite"
    target.write_bytes((FIXTURES / "v1.sqlite").read_bytes())
    target.chmod(0o600)
    return target


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def test_an_old_sqlite_store_opened_without_migrate_is_refused_and_unchanged(tmp_path: Path) -> None:
    path = _copy_v1(tmp_path)
    before = _digest(path)
    with pytest.raises(statekeel.MigrationError) as info:
        await statekeel.open_store(f"sqlite:///{path}", migrate=False)
    assert info.value.version == 1 and info.value.pending[0] == 2
    assert "migrate=True" in str(info.value)
    assert _digest(path) == before
    assert _names(tmp_path) == [path.name]  # no backup, no WAL left behind
    async with statekeel.open_store(f"sqlite:///{path}") as store:  # the default still upgrades it
        assert await store.backend.schema_version() == len(await store.backend.migrations())


async def test_an_up_to_date_store_opens_without_migrate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with statekeel.open_store(url) as store:
        await store.backend.append_messages("k", 0, [], create=True)
    async with statekeel.open_store(url, migrate=False) as store:
        assert await store.backend.load_session("k") is not None


def test_migrate_must_be_a_bool() -> None:
    with pytest.raises(statekeel.InvalidArgument):
        statekeel.open_store("memory://", migrate="no")  # type: ignore[arg-type]


async def _has_sessions_table(url: str) -> bool:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return bool(await conn.fetchval("SELECT to_regclass('sessions') IS NOT NULL"))
    finally:
        await conn.close()


@pytest.mark.postgres
async def test_an_empty_postgres_database_opened_without_migrate_gets_no_schema(pg_database: str) -> None:
    with pytest.raises(statekeel.MigrationError) as info:
        await statekeel.open_store(pg_database, migrate=False)
    assert info.value.version == 0
    assert not await _has_sessions_table(pg_database)


@pytest.mark.postgres
def test_statekeel_info_does_not_create_a_schema_in_an_empty_postgres_database(pg_database: str) -> None:
    result = CliRunner().invoke(main, ["--db", pg_database, "info"])
    assert result.exit_code == 1
    assert "migrate" in result.output
    assert not asyncio.run(_has_sessions_table(pg_database))


async def test_an_empty_sqlite_file_opened_without_migrate_is_refused_and_stays_empty(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.write_bytes(b"")
    with pytest.raises(statekeel.MigrationError) as info:
        await statekeel.open_store(f"sqlite:///{path}", migrate=False)
    assert info.value.version == 0
    assert "migrate=True" in str(info.value)
    assert path.stat().st_size == 0
    assert _names(tmp_path) == ["empty.db"]  # no WAL, no shared-memory file, no backup


async def test_a_missing_sqlite_file_opened_without_migrate_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "absent.db"
    with pytest.raises(statekeel.BackendUnavailable) as info:
        await statekeel.open_store(f"sqlite:///{path}", migrate=False)
    assert "no SQLite database" in str(info.value)
    assert _names(tmp_path) == []


def test_statekeel_info_on_an_empty_file_leaves_it_empty(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.write_bytes(b"")
    result = CliRunner().invoke(main, ["--db", f"sqlite:///{path}", "info"])
    assert result.exit_code == 1
    assert "empty file" in result.output and "nothing was changed" in result.output
    assert path.stat().st_size == 0
    assert _names(tmp_path) == ["empty.db"]
