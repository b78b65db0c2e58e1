"""``statekeel status``, ``doctor``, ``info``, ``recover``, ``audit verify`` and ``migrate`` as a user runs
them: subprocesses against a prepared store on SQLite and PostgreSQL; exit codes and output checked."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import statekeel
from helpers import Prepared, one_line_error, run_statekeel

SCHEMA = len(list((Path(statekeel.__file__).parent / "backends" / "sqlite" / "migrations").glob("*.sql")))
OLD_STORE = Path(__file__).parent.parent / "migration" / "fixtures" / "v1.sqlite"


def flat(text: str) -> str:
    return " ".join(text.split())


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def healthy_store(path: Path) -> str:
    async def fill() -> None:
        async with statekeel.open_store(f"sqlite:///{path}") as store:
            async with store.sessions.open("chat") as session:
                session.add_message("user", "hello")
            await store.audit.append("note", "tester", "chat", {"n": 1})

    asyncio.run(fill())
    return f"sqlite:///{path}"


def test_status_reports_schema_counts_sizes_and_fallback_files(filled: Prepared, tmp_path: Path) -> None:
    result = run_statekeel("status", "--db", filled.url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = flat(result.stdout)
    assert f"schema version {SCHEMA}" in out
    assert "sessions: 8 (6 active, 1 archived, 1 expired)" in out
    assert "tasks: 11" in out and "approvals pending: 2" in out
    assert "fallback files waiting for replay: 0" in out
    facts = json.loads(run_statekeel("status", "--json", "--db", filled.url, cwd=tmp_path).stdout)
    assert sum(facts["counts"]["sessions"].values()) == 8
    assert facts["schema_version"] == SCHEMA
    if filled.url.startswith("sqlite:"):
        assert facts["files"]["database_bytes"] == filled.path.stat().st_size
        assert "database file: " in out and "WAL: " in out
    else:
        assert facts["files"] is None


def test_doctor_names_each_problem_with_what_to_do_and_exits_1(filled: Prepared, tmp_path: Path) -> None:
    result = run_statekeel("doctor", "--db", filled.url, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    out = flat(result.stdout)
    assert f"PROBLEM audit: the audit chain does not verify at entry {filled.tampered_seq}" in out
    # call_read waits at the end of chat-openai; call_lost's turn in moved-on was followed by a user message.
    assert "PROBLEM tool calls: 2 tool call(s) in 2 session(s) have no result" in out
    assert "PROBLEM leases: 1 running task(s) hold an expired lease" in out
    assert "PROBLEM steps: 1 step(s)" in out
    assert "run `statekeel recover`" in out
    assert "ok integrity" in out and "ok fallback" in out
    assert "4 problem(s) found" in out
    report = json.loads(run_statekeel("doctor", "--json", "--db", filled.url, cwd=tmp_path).stdout)
    assert report["ok"] is False
    problems = {f["check"] for f in report["findings"] if f["severity"] == "problem"}
    assert problems == {"audit", "tool calls", "leases", "steps"}
    assert "drift" not in report["checks"]  # only with --files-root


def test_doctor_on_a_healthy_store_exits_0(tmp_path: Path) -> None:
    url = healthy_store(tmp_path / "ok.db")
    result = run_statekeel("doctor", "--db", url, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no problems found" in result.stdout and "PROBLEM" not in result.stdout


def test_doctor_reports_files_changed_on_disk_with_files_root(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    (root / "a.txt").write_text("first")

    async def record() -> None:
        async with statekeel.open_store(f"sqlite:///{tmp_path / 'f.db'}") as store:
            await store.files.record("a.txt", hashlib.sha256(b"first").hexdigest(), 5)

    asyncio.run(record())
    url = f"sqlite:///{tmp_path / 'f.db'}"
    assert run_statekeel("doctor", "--db", url, "--files-root", str(root), cwd=tmp_path).returncode == 0
    (root / "a.txt").write_text("changed behind the agent's back")
    result = run_statekeel("doctor", "--db", url, "--files-root", str(root), cwd=tmp_path)
    assert result.returncode == 1
    assert "PROBLEM drift: 1 recorded file(s) changed on disk" in flat(result.stdout)


def test_info_runs_every_health_check_and_fails_on_a_broken_audit_chain(
    filled: Prepared, tmp_path: Path
) -> None:
    result = run_statekeel("info", "--db", filled.url, cwd=tmp_path)
    assert result.returncode == 1
    out = flat(result.stdout)
    assert f"schema version {SCHEMA}" in out and "initial" in out  # the applied migrations
    assert "PROBLEM audit" in out
    assert "no problems found" not in out


def test_recover_repairs_then_finds_nothing_the_second_time(filled: Prepared, tmp_path: Path) -> None:
    dry = run_statekeel("recover", "--dry-run", "--db", filled.url, cwd=tmp_path)
    out = flat(dry.stdout)
    assert "would repair 2 tool calls answered with an 'interrupted' result" in out
    assert "would repair 1 running tasks with an expired lease marked interrupted" in out
    # The dry run wrote nothing: the same repairs are still to do.
    first = run_statekeel("recover", "--db", filled.url, cwd=tmp_path)
    out = flat(first.stdout)
    assert "repaired 2 tool calls answered with an 'interrupted' result" in out
    assert "repaired 1 running tasks with an expired lease marked interrupted" in out
    assert first.returncode == 1  # the tampered audit chain still needs a person
    assert "the audit log does not verify" in out
    second = run_statekeel("recover", "--json", "--db", filled.url, cwd=tmp_path)
    summary = json.loads(second.stdout)["summary"]
    assert summary["orphaned_tool_calls"] == 0
    assert summary["interrupted_tasks"] == 0
    assert summary["fallback_replayed"] == 0
    assert "nothing to repair" in run_statekeel("recover", "--db", filled.url, cwd=tmp_path).stdout
    doctor = json.loads(run_statekeel("doctor", "--json", "--db", filled.url, cwd=tmp_path).stdout)
    assert {f["check"] for f in doctor["findings"] if f["severity"] == "problem"} == {"audit", "steps"}


def test_audit_verify_names_the_tampered_entry(filled: Prepared, tmp_path: Path) -> None:
    result = run_statekeel("audit", "verify", "--db", filled.url, cwd=tmp_path)
    assert result.returncode == 1
    assert f"audit chain broken at entry {filled.tampered_seq}" in flat(result.stdout)
    verdict = json.loads(run_statekeel("audit", "verify", "--json", "--db", filled.url, cwd=tmp_path).stdout)
    assert verdict["ok"] is False and verdict["first_bad_seq"] == filled.tampered_seq


def test_audit_verify_passes_an_untouched_chain(tmp_path: Path) -> None:
    url = healthy_store(tmp_path / "ok.db")
    result = run_statekeel("audit", "verify", "--db", url, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "audit chain ok: 1 entries" in flat(result.stdout)


def test_migrate_check_reports_pending_migrations_and_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    shutil.copyfile(OLD_STORE, db)
    before = digest(db)
    result = run_statekeel("migrate", "--check", "--db", f"sqlite:///{db}", cwd=tmp_path)
    assert result.returncode == 1
    assert f"schema version 1: {SCHEMA - 1} migration(s) pending" in flat(result.stdout)
    listed = run_statekeel("migrate", "--check", "--json", "--db", f"sqlite:///{db}", cwd=tmp_path)
    assert listed.returncode == 1
    assert json.loads(listed.stdout) == {"schema_version": 1, "pending": list(range(2, SCHEMA + 1))}
    # Read commands refuse an old schema without upgrading it, and say how to.
    status = run_statekeel("status", "--db", f"sqlite:///{db}", cwd=tmp_path)
    assert "statekeel migrate" in one_line_error(status)
    assert digest(db) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.db"]


def test_migrate_upgrades_an_old_store_once(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    shutil.copyfile(OLD_STORE, db)
    result = run_statekeel("migrate", "--db", f"sqlite:///{db}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"schema version 1 → {SCHEMA}: {SCHEMA - 1} migration(s) applied" in flat(result.stdout)
    again = run_statekeel("migrate", "--db", f"sqlite:///{db}", cwd=tmp_path)
    assert f"schema version {SCHEMA}: already up to date" in again.stdout
    assert run_statekeel("migrate", "--check", "--db", f"sqlite:///{db}", cwd=tmp_path).returncode == 0


def test_migrate_creates_a_store_only_with_create(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    assert "no store at" in one_line_error(run_statekeel("migrate", "--db", url, cwd=tmp_path))
    assert not (tmp_path / "new.db").exists()
    result = run_statekeel("migrate", "--create", "--db", url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"schema version 0 → {SCHEMA}" in flat(result.stdout)
    assert (tmp_path / "new.db").stat().st_mode & 0o777 == 0o600


def test_migrate_creates_the_schema_of_an_empty_postgresql_database(pg_database: str, tmp_path: Path) -> None:
    check = run_statekeel("migrate", "--check", "--db", pg_database, cwd=tmp_path)
    assert check.returncode == 1 and f"schema version 0: {SCHEMA} migration(s) pending" in flat(check.stdout)
    assert "statekeel migrate creates the schema" in one_line_error(
        run_statekeel("status", "--db", pg_database, cwd=tmp_path)
    )
    result = run_statekeel("migrate", "--db", pg_database, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert run_statekeel("status", "--db", pg_database, cwd=tmp_path).returncode == 0


def test_fallback_files_are_reported_then_replayed_by_recover(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"

    async def outage() -> None:
        async with statekeel.open_store(f"sqlite:///{db}", busy_timeout_ms=50) as store:
            session = await store.sessions.get_or_create("s")
            session.add_message("user", "before")
            await store.sessions.save(session)
            blocker = sqlite3.connect(db, isolation_level=None)
            try:
                blocker.execute("BEGIN EXCLUSIVE")  # every write fails: the save goes to a fallback file
                session.add_message("user", "during the outage")
                await store.sessions.save(session)
                blocker.execute("ROLLBACK")
            finally:
                blocker.close()

    asyncio.run(outage())
    url = f"sqlite:///{db}"
    assert "fallback files waiting for replay: 1" in flat(
        run_statekeel("status", "--db", url, cwd=tmp_path).stdout
    )
    doctor = run_statekeel("doctor", "--db", url, cwd=tmp_path)
    assert doctor.returncode == 1 and "PROBLEM fallback: 1 session fallback file(s)" in flat(doctor.stdout)
    # show reads the store as it is: the message of the outage is not in it yet, and it says so.
    before = flat(run_statekeel("show", "s", "--db", url, cwd=tmp_path).stdout)
    assert "a fallback file of this session waits for replay" in before and "during the outage" not in before
    replayed = run_statekeel("recover", "--db", url, cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "repaired 1 fallback files replayed into the store" in flat(replayed.stdout)
    assert "#1 user during the outage" in flat(run_statekeel("show", "s", "--db", url, cwd=tmp_path).stdout)
    assert "nothing to repair" in run_statekeel("recover", "--db", url, cwd=tmp_path).stdout
    assert run_statekeel("doctor", "--db", url, cwd=tmp_path).returncode == 0
