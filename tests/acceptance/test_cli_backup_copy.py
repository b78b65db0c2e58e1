"""``statekeel backup``, ``copy`` and ``gc`` as a user runs them, on SQLite and PostgreSQL: what they
write, what they verify, and what they refuse to touch."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

import statekeel
from helpers import SECRET_TEXT, Prepared, fill_sealed_session, one_line_error, run_statekeel, write_key_file


def flat(text: str) -> str:
    return " ".join(text.split())


def counts(url: str, cwd: Path) -> dict[str, object]:
    result = run_statekeel("status", "--json", "--db", url, cwd=cwd)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    return dict(facts["counts"])


def test_backup_writes_an_owner_only_copy_that_holds_everything(filled: Prepared, tmp_path: Path) -> None:
    dest = tmp_path / "backup.db"
    result = run_statekeel("backup", str(dest), "--db", filled.url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"to {dest}" in flat(result.stdout)
    assert dest.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("backup")) == ["backup.db"]
    copy_url = f"sqlite:///{dest}"
    assert counts(copy_url, tmp_path) == counts(filled.url, tmp_path)
    # A copy of the store as it is: the tampered audit entry is still found.
    assert run_statekeel("audit", "verify", "--db", copy_url, cwd=tmp_path).returncode == 1


def test_backup_reads_the_committed_state_while_a_writer_holds_the_write_lock(tmp_path: Path) -> None:
    db = tmp_path / "live.db"

    async def fill() -> None:
        async with statekeel.open_store(f"sqlite:///{db}") as store, store.sessions.open("live") as session:
            for i in range(200):
                session.add_message("user", f"message {i}")

    asyncio.run(fill())
    writer = sqlite3.connect(db, isolation_level=None)
    try:
        # Another process is mid-transaction: it holds the write lock with a change not yet committed.
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE sessions SET status = 'expired' WHERE key = 'live'")
        result = run_statekeel("backup", str(tmp_path / "snap.db"), "--db", f"sqlite:///{db}", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    snap = sqlite3.connect(tmp_path / "snap.db")
    try:
        assert snap.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert snap.execute("SELECT count(*) FROM messages").fetchone()[0] == 200
        assert snap.execute("SELECT status FROM sessions WHERE key = 'live'").fetchone()[0] == "active"
    finally:
        snap.close()


def test_backup_onto_an_existing_file_is_refused_and_leaves_it(filled: Prepared, tmp_path: Path) -> None:
    dest = tmp_path / "precious.db"
    dest.write_bytes(b"not to be overwritten")
    error = one_line_error(run_statekeel("backup", str(dest), "--db", filled.url, cwd=tmp_path))
    assert "already exists" in error
    assert dest.read_bytes() == b"not to be overwritten"


def test_copy_moves_every_kind_and_verifies_the_counts(filled: Prepared, tmp_path: Path) -> None:
    dest = f"sqlite:///{tmp_path / 'copy.db'}"
    result = run_statekeel("copy", filled.url, dest, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = flat(result.stdout)
    assert "every table verified" in out
    source = counts(filled.url, tmp_path)
    audited = source["audit_entries"]
    assert f"audit_log │ {audited} │ {audited} │ {audited}" in out and "sessions │ 8 │ 8 │ 8" in out
    assert counts(dest, tmp_path) == source


@pytest.mark.postgres
def test_copy_from_sqlite_to_postgresql_and_back(
    prepared: Prepared, pg_migrated: str, tmp_path: Path
) -> None:
    # postgresql+asyncpg:// is SQLAlchemy's spelling: accepted as postgresql://.
    to_pg = run_statekeel(
        "copy", prepared.url, pg_migrated.replace("postgresql://", "postgresql+asyncpg://"), cwd=tmp_path
    )
    assert to_pg.returncode == 0, to_pg.stderr
    back = f"sqlite:///{tmp_path / 'back.db'}"
    assert run_statekeel("copy", pg_migrated, back, cwd=tmp_path).returncode == 0
    assert counts(back, tmp_path) == counts(prepared.url, tmp_path) == counts(pg_migrated, tmp_path)


@pytest.mark.postgres
def test_copy_between_all_three_dialects_keeps_every_count(
    prepared: Prepared, my_migrated: str, pg_migrated: str, tmp_path: Path
) -> None:
    to_maria = run_statekeel("copy", prepared.url, my_migrated, cwd=tmp_path)
    assert to_maria.returncode == 0, to_maria.stderr
    to_pg = run_statekeel("copy", my_migrated, pg_migrated, cwd=tmp_path)
    assert to_pg.returncode == 0, to_pg.stderr
    back = f"sqlite:///{tmp_path / 'back.db'}"
    assert run_statekeel("copy", pg_migrated, back, cwd=tmp_path).returncode == 0
    expected = counts(prepared.url, tmp_path)
    assert counts(my_migrated, tmp_path) == expected
    assert counts(pg_migrated, tmp_path) == expected
    assert counts(back, tmp_path) == expected


def test_a_copy_that_fails_into_a_new_sqlite_file_leaves_no_file_behind(tmp_path: Path) -> None:
    src = tmp_path / "src.db"

    async def fill() -> None:
        async with statekeel.open_store(f"sqlite:///{src}") as store, store.sessions.open("real") as session:
            session.add_message("user", "hello")

    asyncio.run(fill())
    # A message of a session that does not exist, written behind statekeel with foreign keys off: the
    # destination refuses it, after the copy has created the destination and copied the sessions.
    conn = sqlite3.connect(src)
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute(
        "INSERT INTO messages (session_key, seq, role, payload, created_at) "
        "VALUES ('ghost', 0, 'user', '\"boo\"', 0)"
    )
    conn.commit()
    conn.close()
    (tmp_path / "same.db").symlink_to(src)
    before = sorted(p.name for p in tmp_path.iterdir())
    source = hashlib.sha256(src.read_bytes()).hexdigest()
    error = one_line_error(
        run_statekeel("copy", f"sqlite:///{src}", f"sqlite:///{tmp_path / 'new.db'}", cwd=tmp_path)
    )
    assert "cannot copy to" in error and "FOREIGN KEY" in error
    error = one_line_error(
        run_statekeel("copy", f"sqlite:///{src}", f"sqlite:///{tmp_path / 'same.db'}", cwd=tmp_path)
    )
    assert "source and destination are the same database" in error
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert hashlib.sha256(src.read_bytes()).hexdigest() == source


def test_copy_of_an_encrypted_store_keeps_its_values_sealed_under_the_same_key(tmp_path: Path) -> None:
    key, src, dest = bytes(range(32)), tmp_path / "sealed.db", tmp_path / "copy.db"
    asyncio.run(fill_sealed_session(f"sqlite:///{src}", key))
    key_file = write_key_file(tmp_path / "store.key", key)
    copied = run_statekeel("copy", f"sqlite:///{src}", f"sqlite:///{dest}", cwd=tmp_path)
    assert copied.returncode == 0, copied.stderr
    assert SECRET_TEXT.encode() not in dest.read_bytes()
    error = one_line_error(run_statekeel("show", "chat", "--db", f"sqlite:///{dest}", cwd=tmp_path))
    assert "--key-file" in error
    shown = run_statekeel(
        "show", "chat", "--db", f"sqlite:///{dest}", "--key-file", str(key_file), cwd=tmp_path
    )
    assert shown.returncode == 0 and SECRET_TEXT in shown.stdout, shown.stderr


def test_copy_into_a_store_that_holds_data_needs_force(filled: Prepared, tmp_path: Path) -> None:
    path = tmp_path / "busy.db"

    async def fill() -> None:
        async with statekeel.open_store(f"sqlite:///{path}") as store, store.sessions.open("mine") as session:
            session.add_message("user", "keep me")

    asyncio.run(fill())
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    error = one_line_error(run_statekeel("copy", filled.url, f"sqlite:///{path}", cwd=tmp_path))
    assert "is not empty (sessions holds 1 row); nothing was copied: pass --force" in error
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    forced = run_statekeel("copy", "--force", filled.url, f"sqlite:///{path}", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert "earlier contents were replaced" in flat(forced.stdout)
    sessions = json.loads(
        run_statekeel("sessions", "--json", "--db", f"sqlite:///{path}", cwd=tmp_path).stdout
    )
    assert "mine" not in {s["key"] for s in sessions} and len(sessions) == 8


def test_gc_dry_run_counts_and_gc_deletes_what_retention_allows(filled: Prepared, tmp_path: Path) -> None:
    # The prepared trace started on 2025-03-01: older than the 30 days spans are kept.
    before = counts(filled.url, tmp_path)
    dry = run_statekeel("gc", "--dry-run", "--db", filled.url, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "would delete 6 rows" in flat(dry.stdout)
    assert run_statekeel("trace", filled.trace_id, "--db", filled.url, cwd=tmp_path).returncode == 0
    result = run_statekeel("gc", "--db", filled.url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = flat(result.stdout)
    assert "purging" in out and "6/6" in out  # the progress bar, filled
    assert "traces │ 6" in out and "deleted 6 rows" in out
    assert run_statekeel("trace", filled.trace_id, "--db", filled.url, cwd=tmp_path).returncode == 1
    # Never an audit entry, an approval or an unfinished task.
    after = counts(filled.url, tmp_path)
    assert after["audit_entries"] == before["audit_entries"] > 0 and after["approvals_pending"] == 2
    again = json.loads(run_statekeel("gc", "--json", "--db", filled.url, cwd=tmp_path).stdout)
    assert again["total"] == 0


def test_gc_takes_the_age_of_each_kind_in_days(filled: Prepared, tmp_path: Path) -> None:
    kept = json.loads(
        run_statekeel(
            "gc", "--dry-run", "--json", "--traces", "100000", "--db", filled.url, cwd=tmp_path
        ).stdout
    )
    assert kept["report"]["traces"] == 0
    tasks = json.loads(
        run_statekeel("gc", "--dry-run", "--json", "--tasks", "0", "--db", filled.url, cwd=tmp_path).stdout
    )
    assert tasks["report"]["tasks"] == 2  # the finished ones outside a workflow: lint and deploy preview
