"""Invariant 8 on SQLite: numbered migrations, each committed with its row; refusals write nothing; a
failed migration leaves the database as it was, with an owner-only backup; concurrent openers agree."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
from migration_support import open_concurrently

import statekeel
from helpers import sqlite_url
from statekeel.backends.sql.migrations import Migration, load_migrations
from statekeel.backends.sqlite.backend import SqliteBackend, migrations_shipped
from statekeel.codec import Codec

SHIPPED = migrations_shipped()
CURRENT = len(SHIPPED)
FIXTURES = Path(__file__).parent / "fixtures"

BROKEN = Migration(
    CURRENT + 1,
    "broken",
    # Changes data and schema first, then fails: all of it must roll back.
    "UPDATE sessions SET status = 'archived';\n"
    "DELETE FROM messages;\n"
    "CREATE TABLE added_by_broken (a INTEGER);\n"
    "INSERT INTO added_by_broken VALUES (1);\n"
    "SELECT * FROM no_such_table;\n",
)


def dump(path: Path) -> dict[str, Any]:
    """Every table's rows and the schema, through a plain read-only connection."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        schema = conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY type, name").fetchall()
        tables = [r[1] for r in schema if r[0] == "table"]
        rows = {t: sorted(conn.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}
        return {"schema": schema, "rows": rows}
    finally:
        conn.close()


def versions(path: Path) -> list[tuple[int, int]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(
            "SELECT version, count(*) FROM schema_migrations GROUP BY version ORDER BY version"
        ).fetchall()
    finally:
        conn.close()


def backups(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith(".bak"))


async def make_store_with_data(path: Path) -> None:
    async with statekeel.open_store(sqlite_url(path)) as store:
        for key in ("a", "b"):
            session = await store.sessions.get_or_create(key)
            for i in range(3):
                session.add_message("user", f"{key}{i}")
            await store.sessions.save(session)


def copy_fixture(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copyfile(FIXTURES / name, target)
    os.chmod(target, 0o600)
    return target


async def test_new_file_gets_every_shipped_migration_once(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    async with statekeel.open_store(sqlite_url(path)) as store:
        infos = await store.backend.migrations()
        assert [(m.version, m.name) for m in infos] == [(m.version, m.name) for m in SHIPPED]
        assert [m.checksum for m in infos] == [m.checksum for m in SHIPPED]
        assert await store.backend.schema_version() == CURRENT
    assert versions(path) == [(v, 1) for v in range(1, CURRENT + 1)]
    assert backups(tmp_path) == []  # nothing existed: nothing to back up


def test_shipped_migrations_are_dense_and_named() -> None:
    assert [m.version for m in SHIPPED] == list(range(1, CURRENT + 1))
    assert SHIPPED[0].name == "initial"
    assert load_migrations("statekeel.backends.sqlite.migrations") == SHIPPED


async def test_failed_migration_leaves_database_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    await make_store_with_data(path)
    before_bytes = path.read_bytes()
    before = dump(path)
    backend = SqliteBackend(sqlite_url(path), str(path), codec=Codec(), migrations=[*SHIPPED, BROKEN])
    with pytest.raises(statekeel.MigrationError) as info:
        await backend.initialize()
    assert info.value.version == CURRENT + 1
    assert "no_such_table" in str(info.value)
    # Row for row and byte for byte as before.
    assert dump(path) == before
    assert path.read_bytes() == before_bytes
    # The backup was taken before migrating, is owner-only, holds the same data, and is kept.
    backup = Path(info.value.backup)
    assert backups(tmp_path) == [backup]
    assert stat.S_IMODE(os.stat(backup).st_mode) == 0o600
    assert dump(backup)["rows"] == before["rows"]
    # The store is still usable with the shipped migrations.
    async with statekeel.open_store(sqlite_url(path)) as store:
        rows = await store.backend.read_messages("a")
        assert [r.payload["content"] for r in rows] == ["a0", "a1", "a2"]


async def test_failed_first_migration_of_a_new_file_leaves_it_without_schema(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    bad = Migration(1, "initial", "CREATE TABLE t (a INTEGER);\nINSERT INTO nowhere VALUES (1);\n")
    backend = SqliteBackend(sqlite_url(path), str(path), codec=Codec(), migrations=[bad])
    with pytest.raises(statekeel.MigrationError):
        await backend.initialize()
    assert dump(path)["schema"] == []
    async with statekeel.open_store(sqlite_url(path)) as store:
        assert await store.backend.schema_version() == CURRENT


async def test_database_newer_than_the_code_is_refused_and_not_modified(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    await make_store_with_data(path)
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO schema_migrations (version, name, checksum, applied_at) VALUES (?, 'future', 'x', 0)",
        (CURRENT + 5,),
    )
    conn.commit()
    conn.close()
    before_bytes = path.read_bytes()
    with pytest.raises(statekeel.SchemaTooNew) as info:
        await statekeel.open_store(sqlite_url(path))
    assert (info.value.found, info.value.supported) == (CURRENT + 5, CURRENT)
    assert path.read_bytes() == before_bytes
    assert sorted(os.listdir(tmp_path)) == ["store.db"]


async def test_applied_migration_with_a_different_checksum_is_migration_error(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    await make_store_with_data(path)
    before_bytes = path.read_bytes()
    edited = [Migration(m.version, m.name, m.sql + "\n-- edited after release\n") for m in SHIPPED[:1]]
    backend = SqliteBackend(sqlite_url(path), str(path), codec=Codec(), migrations=edited + SHIPPED[1:])
    with pytest.raises(statekeel.MigrationError) as info:
        await backend.initialize()
    assert info.value.version == 1
    assert "edited after release" in str(info.value)
    assert path.read_bytes() == before_bytes
    assert backups(tmp_path) == []


async def test_checksum_tampered_in_the_database_is_migration_error(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    await make_store_with_data(path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_migrations SET checksum = 'feedface' WHERE version = ?", (CURRENT,))
    conn.commit()
    conn.close()
    with pytest.raises(statekeel.MigrationError) as info:
        await statekeel.open_store(sqlite_url(path))
    assert info.value.version == CURRENT


def _load_fixture_script() -> Any:
    spec = importlib.util.spec_from_file_location("make_v1", FIXTURES / "make_v1.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_frozen_v1_database_upgrades_with_its_data_intact(tmp_path: Path) -> None:
    expected = _load_fixture_script().EXPECTED
    path = copy_fixture("v1.sqlite", tmp_path)
    assert versions(path) == [(1, 1)]
    async with statekeel.open_store(sqlite_url(path)) as store:
        assert await store.backend.schema_version() == CURRENT
        for key, (status, metadata, messages, archived) in expected.items():
            record = await store.backend.load_session(key)
            assert record is not None
            assert (record.status, record.metadata) == (status, metadata)
            assert (record.head_seq, record.last_consolidated) == (len(messages), archived)
            live = await store.backend.read_messages(key)
            assert [(r.seq, r.payload) for r in live] == list(enumerate(messages))[archived:]
            old = await store.backend.read_archive(key)
            assert [(a.seq, a.payload) for a in old] == list(enumerate(messages))[:archived]
        # The upgraded database takes new writes where the old data left off.
        session = await store.sessions.get_or_create("frozen-agent")
        session.add_message("assistant", "after the upgrade")
        await store.sessions.save(session)
        rows = await store.backend.read_messages("frozen-agent", start=5)
        assert [(r.seq, r.payload["content"]) for r in rows] == [(5, "after the upgrade")]
        assert await store.backend.integrity_check() == []
    assert versions(path) == [(v, 1) for v in range(1, CURRENT + 1)]
    assert backups(tmp_path) == []  # taken before the upgrade, removed after its success


async def test_sessions_written_before_tool_calls_were_counted_are_counted_once_after_the_upgrade(
    tmp_path: Path,
) -> None:
    path = copy_fixture("v1.sqlite", tmp_path)
    # Written by the old code: a session whose last turn asks for a tool that never answered.
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c9", "type": "function"}]}
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute(
        "INSERT INTO sessions (key, metadata, head_seq, created_at, updated_at) VALUES ('cut', '{}', 2, 1, 1)"
    )
    for seq, message in enumerate([{"role": "user", "content": "go"}, call]):
        conn.execute(
            "INSERT INTO messages (session_key, seq, role, payload, created_at) VALUES ('cut', ?, ?, ?, 1)",
            (seq, message["role"], json.dumps(message)),
        )
    conn.execute("COMMIT")
    conn.close()
    async with statekeel.open_store(sqlite_url(path)) as store:
        unknown = await store.backend.sessions_with_open_calls()
        assert {s.key: s.open_calls for s in unknown} == {"cut": -1, "frozen-agent": -1, "frozen-idle": -1}
        report = await store.recover()
        assert report.orphaned_tool_calls == {"cut": ["c9"]}
        assert await store.backend.sessions_with_open_calls() == []  # counted once, then only by saves
        assert (await store.recover()).orphaned_tool_calls == {}


async def test_backup_is_taken_before_upgrading_an_existing_file(tmp_path: Path) -> None:
    path = copy_fixture("v1.sqlite", tmp_path)
    before = dump(path)
    # Migration 2 is replaced by a failing one: the backup must exist and be the v1 database.
    broken_2 = Migration(2, "broken", BROKEN.sql)
    backend = SqliteBackend(sqlite_url(path), str(path), codec=Codec(), migrations=[SHIPPED[0], broken_2])
    with pytest.raises(statekeel.MigrationError) as info:
        await backend.initialize()
    backup = Path(info.value.backup)
    assert backup.parent == tmp_path and backup.name.startswith("v1.sqlite.pre-v0002-")
    assert stat.S_IMODE(os.stat(backup).st_mode) == 0o600
    assert dump(backup) == before
    assert dump(path) == before


@pytest.mark.parametrize("round_", range(3))
def test_processes_opening_a_new_file_at_once_all_succeed_and_migrate_once(
    tmp_path: Path, round_: int
) -> None:
    path = tmp_path / "race.db"
    outputs = open_concurrently(sqlite_url(path), 3)
    assert outputs == [f"ok {CURRENT}"] * 3
    assert versions(path) == [(v, 1) for v in range(1, CURRENT + 1)]
    keys = {r[0] for r in sqlite3.connect(path).execute("SELECT key FROM sessions")}
    assert keys == {"opener-0", "opener-1", "opener-2"}
    assert backups(tmp_path) == []


def test_processes_upgrading_the_same_old_file_at_once_all_succeed(tmp_path: Path) -> None:
    path = copy_fixture("v1.sqlite", tmp_path)
    outputs = open_concurrently(sqlite_url(path), 3)
    assert outputs == [f"ok {CURRENT}"] * 3
    assert versions(path) == [(v, 1) for v in range(1, CURRENT + 1)]
    assert backups(tmp_path) == []
