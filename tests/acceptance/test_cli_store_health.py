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
    assert "4 problems found" in out
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
    assert "would repair 1 running task with an expired lease marked interrupted" in out
    # The dry run wrote nothing: the same repairs are still to do.
    first = run_statekeel("recover", "--db", filled.url, cwd=tmp_path)
    out = flat(first.stdout)
    assert "repaired 2 tool calls answered with an 'interrupted' result" in out
    assert "repaired 1 running task with an expired lease marked interrupted" in out
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
    assert "audit chain ok: 1 entry" in flat(result.stdout)


def test_migrate_check_reports_pending_migrations_and_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    shutil.copyfile(OLD_STORE, db)
    before = digest(db)
    result = run_statekeel("migrate", "--check", "--db", f"sqlite:///{db}", cwd=tmp_path)
    assert result.returncode == 1
    assert f"schema version 1: {SCHEMA - 1} migrations pending" in flat(result.stdout)
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
    assert f"schema version 1 → {SCHEMA}: {SCHEMA - 1} migrations applied" in flat(result.stdout)
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
    assert check.returncode == 1 and f"schema version 0: {SCHEMA} migrations pending" in flat(check.stdout)
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
    assert "repaired 1 fallback file replayed into the store" in flat(replayed.stdout)
    assert "#1 user during the outage" in flat(run_statekeel("show", "s", "--db", url, cwd=tmp_path).stdout)
    assert "nothing to repair" in run_statekeel("recover", "--db", url, cwd=tmp_path).stdout
    assert run_statekeel("doctor", "--db", url, cwd=tmp_path).returncode == 0


def store_needing_recovery(path: Path, *, audit_key: bytes | None = None) -> dict[str, str]:
    """A store holding one of each thing recover() repairs or lists: two tool calls left without a result
    by a process that is gone, a running task whose lease expired, a step in doubt and a pending
    approval. Returns their names."""

    async def fill() -> dict[str, str]:
        async with statekeel.open_store(f"sqlite:///{path}", audit_key=audit_key) as store:
            session = await store.sessions.get_or_create("chat-lost")
            session.add_message("user", "deploy and notify")
            session.add_message(
                "assistant",
                None,
                tool_calls=[
                    {
                        "id": "call_deploy",
                        "type": "function",
                        "function": {"name": "deploy", "arguments": "{}"},
                    },
                    {
                        "id": "call_notify",
                        "type": "function",
                        "function": {"name": "notify", "arguments": "{}"},
                    },
                ],
            )
            await store.sessions.save(session)
            doubtful = await store.tasks.create("push the branch", status="queued")
            claimed = await store.tasks.claim("worker-7", lease_seconds=3600)
            assert claimed is not None and claimed.id == doubtful.id
            try:
                # The step ran but its value cannot be stored: it stays started, in doubt once nobody runs it.
                await store.tasks.step(claimed.id, "push", lambda: {1, 2}, lease_epoch=claimed.lease_epoch)
            except statekeel.SerializationError:
                pass
            await store.tasks.transition(
                claimed.id, "interrupted", worker_id="worker-7", lease_epoch=claimed.lease_epoch
            )
            lapsed = await store.tasks.create("long build", status="queued")
            assert await store.tasks.claim("worker-dead", lease_seconds=0.001) is not None
            approval = await store.approvals.request("repo", "deploy", {"env": "prod"}, requested_by="agent")
            return {"task": doubtful.id, "lapsed": lapsed.id, "approval": approval.id}

    return asyncio.run(fill())


def test_recover_names_every_call_task_step_and_approval_it_found(tmp_path: Path) -> None:
    names = store_needing_recovery(tmp_path / "s.db")
    url = f"sqlite:///{tmp_path / 's.db'}"
    dry = run_statekeel("recover", "--dry-run", "--json", "--db", url, cwd=tmp_path)
    assert dry.returncode == 1, dry.stdout + dry.stderr  # a step in doubt needs a person
    report = json.loads(dry.stdout)
    assert report["needs_attention"] is True and report["dry_run"] is True
    details = report["details"]
    assert details["orphaned_tool_calls"] == {"chat-lost": ["call_deploy", "call_notify"]}
    assert [t["id"] for t in details["interrupted_tasks"]] == [names["lapsed"]]
    assert details["interrupted_tasks"][0]["lease_owner"] == "worker-dead"
    assert [(s["task_id"], s["step_key"]) for s in details["steps_in_doubt"]] == [(names["task"], "push")]
    assert [a["id"] for a in details["pending_approvals"]] == [names["approval"]]
    text = run_statekeel("recover", "--dry-run", "--db", url, cwd=tmp_path)
    assert text.returncode == 1
    out = flat(text.stdout)
    assert "would repair 2 tool calls answered with an 'interrupted' result session chat-lost: " in out
    assert "call_deploy, call_notify" in out
    assert f"task {names['lapsed']} (long build): held by worker-dead" in out
    assert f"needs attention 1 task step in doubt task {names['task']} step push (attempt 1" in out
    assert f"approval {names['approval']}: deploy on repo, requested by agent" in out
    # The repair names what it did, the same; the step in doubt still needs a person afterwards.
    done = run_statekeel("recover", "--json", "--db", url, cwd=tmp_path)
    assert done.returncode == 1
    repaired = json.loads(done.stdout)["details"]
    assert repaired["orphaned_tool_calls"] == details["orphaned_tool_calls"]
    assert repaired["interrupted_tasks"][0]["id"] == names["lapsed"]
    assert (
        repaired["interrupted_tasks"][0]["lease_expires_at"]
        == details["interrupted_tasks"][0]["lease_expires_at"]
    )
    assert repaired["interrupted_tasks"][0]["lease_expires_at"] is not None
    again = json.loads(run_statekeel("recover", "--json", "--db", url, cwd=tmp_path).stdout)["details"]
    assert again["orphaned_tool_calls"] == {} and again["interrupted_tasks"] == []
    assert [s["step_key"] for s in again["steps_in_doubt"]] == ["push"]


def test_recover_says_when_the_lease_of_each_task_it_interrupted_expired(tmp_path: Path) -> None:
    names = store_needing_recovery(tmp_path / "s.db")
    url = f"sqlite:///{tmp_path / 's.db'}"

    async def expiry() -> str:
        async with statekeel.open_store(url) as store:
            task = await store.tasks.get(names["lapsed"])
            assert task.lease_expires_at is not None
            return task.lease_expires_at.isoformat(timespec="seconds")

    expired = asyncio.run(expiry())
    for args in (("--dry-run",), ()):
        out = flat(run_statekeel("recover", *args, "--db", url, cwd=tmp_path).stdout)
        task = f"task {names['lapsed']} (long build)"
        assert f"{task}: held by worker-dead at epoch 1, its lease expired at {expired}" in out
        assert "expired never" not in out


def test_recover_dry_run_exits_0_when_only_repairs_are_waiting(tmp_path: Path) -> None:
    url = healthy_store(tmp_path / "h.db")
    assert run_statekeel("recover", "--dry-run", "--db", url, cwd=tmp_path).returncode == 0

    async def leave_a_call() -> None:
        async with statekeel.open_store(url) as store:
            session = await store.sessions.get_or_create("lost")
            session.add_message(
                "assistant",
                None,
                tool_calls=[{"id": "c1", "type": "function", "function": {"name": "x", "arguments": "{}"}}],
            )
            await store.sessions.save(session)

    asyncio.run(leave_a_call())
    dry = run_statekeel("recover", "--dry-run", "--db", url, cwd=tmp_path)
    assert dry.returncode == 0, dry.stdout  # recover repairs it: nobody is needed
    assert "session lost: c1" in flat(dry.stdout)


AUDIT_KEY = bytes(range(32))


def audit_key_file(tmp_path: Path) -> Path:
    path = tmp_path / "audit.key"
    path.write_text("# the store's audit key\n" + AUDIT_KEY.hex() + "\n")
    path.chmod(0o600)
    return path


def test_recover_on_a_keyed_audit_chain_needs_the_audit_key_and_keeps_the_chain_keyed(tmp_path: Path) -> None:
    names = store_needing_recovery(tmp_path / "k.db", audit_key=AUDIT_KEY)
    url = f"sqlite:///{tmp_path / 'k.db'}"
    key_file = audit_key_file(tmp_path)

    async def verify() -> statekeel.AuditVerification:
        async with statekeel.open_store(url, audit_key=AUDIT_KEY) as store:
            return await store.audit.verify()

    before = asyncio.run(verify())
    assert before.ok and before.authenticated == before.count
    # Without the key: the lease expiry (an audited write) is refused, nothing of it written; the rest
    # of recovery ran, and the command says what to pass.
    without = run_statekeel("recover", "--json", "--db", url, cwd=tmp_path)
    assert without.returncode == 1, without.stderr
    report = json.loads(without.stdout)
    assert set(report["details"]["audit_key_needed"]) == {"tasks"}
    assert report["details"]["interrupted_tasks"] == []
    assert any("--audit-key-file" in line for line in report["advice"])
    after = asyncio.run(verify())
    assert after.ok and after.count == before.count and after.authenticated == after.count
    text = run_statekeel("recover", "--db", url, cwd=tmp_path)
    assert "needs attention 1 repair refused: the audit chain is keyed" in flat(text.stdout)
    # With the key (the option, or the environment variable): the repair is made and the chain verifies.
    with_key = run_statekeel(
        "recover", "--json", "--audit-key-file", str(key_file), "--db", url, cwd=tmp_path
    )
    report = json.loads(with_key.stdout)
    assert report["details"]["audit_key_needed"] == {}
    assert [t["id"] for t in report["details"]["interrupted_tasks"]] == [names["lapsed"]]
    final = asyncio.run(verify())
    assert final.ok and final.count > before.count and final.authenticated == final.count
    audit = run_statekeel(
        "audit", "verify", "--db", url, cwd=tmp_path, env={"STATEKEEL_AUDIT_KEY_FILE": str(key_file)}
    )
    assert audit.returncode == 0 and f"{final.count} authenticated" in audit.stdout
    # The group's option works too, and a bad audit key file is refused in one line before anything opens.
    group = run_statekeel("--audit-key-file", str(key_file), "audit", "verify", "--db", url, cwd=tmp_path)
    assert group.returncode == 0 and "authenticated" in group.stdout
    key_file.chmod(0o644)
    assert "readable by others" in one_line_error(
        run_statekeel("recover", "--audit-key-file", str(key_file), "--db", url, cwd=tmp_path)
    )
    short = tmp_path / "short.key"
    short.write_text("abcd\n")
    short.chmod(0o600)
    assert "at least 32" in one_line_error(
        run_statekeel("doctor", "--db", url, cwd=tmp_path, env={"STATEKEEL_AUDIT_KEY_FILE": str(short)})
    )


def test_status_of_a_plain_nats_store_says_not_held_for_the_kinds_it_does_not_hold(
    nats_url: str, tmp_path: Path
) -> None:
    async def fill() -> None:
        async with statekeel.open_store(nats_url) as store, store.sessions.open("chat") as session:
            session.add_message("user", "hello")

    asyncio.run(fill())
    result = run_statekeel("status", "--db", nats_url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "sessions: 1 (1 active)" in out and "audit entries: 0" in out
    for line in (
        "tasks: not held",
        "workflows: not held",
        "approvals: not held",
        "langgraph threads: not held",
    ):
        assert line in out
    assert "memories: not held, file changes: not held" in out
    facts = json.loads(run_statekeel("status", "--json", "--db", nats_url, cwd=tmp_path).stdout)
    assert set(facts["not_held"]) == {"tasks", "workflows", "approvals", "memory", "files", "checkpoints"}
    assert facts["counts"]["tasks"] is None and facts["counts"]["memories"] is None
    assert facts["counts"]["sessions"]["active"] == 1 and facts["counts"]["audit_entries"] == 0
