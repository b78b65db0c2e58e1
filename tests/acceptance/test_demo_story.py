"""``statekeel demo`` (the story) as a user runs it: a subprocess, killed at each of its crash points.

Each run is checked from the outside: the exit code, the JSON account's checks, the side-effect counts
the agent's tools wrote outside the store, and what recover() reported after the kill. The checks
themselves are shown to fail when the world or the store is tampered with before they run.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pydantic
import pytest
from click.testing import CliRunner

import statekeel
from helpers import CHAT, assert_accepted, run_statekeel
from statekeel.cli import main
from statekeel.demo import story
from statekeel.demo import story_agent as agent
from statekeel.demo import workspace as ws
from statekeel.store import Store
from statekeel.transcripts import INTERRUPTED_TEXT, Dialect

POINTS = len(agent.CRASH_POINTS)
CHECKS = {
    "effects_exactly_once",
    "in_doubt_resolved",
    "transcript_valid",
    "acknowledged_writes_survived",
    "tests_pass",
    "audit_verified",
}
# How a step found in doubt at each crash point must be settled: by what the world shows.
RESOLVED = {
    agent.EDIT_STARTED: "failed",  # the file was not changed yet: the edit runs (once)
    agent.EDIT_DONE: "succeeded",  # the file holds the fix: the edit is not run again
    agent.ASKED: "succeeded",  # the request is stored: no second request
    agent.RELEASED: "succeeded",  # VERSION moved: no second release
}


def story_json(*args: str, cwd: Path) -> dict[str, Any]:
    result = run_statekeel("demo", "--json", *args, cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    account: dict[str, Any] = json.loads(result.stdout)
    return account


@pytest.mark.slow
@pytest.mark.parametrize("crash_at", range(1, POINTS + 1))
def test_demo_story_finishes_the_job_after_a_kill_at_every_crash_point(tmp_path: Path, crash_at: int) -> None:
    account = story_json("--crash-at", str(crash_at), cwd=tmp_path)
    point = agent.CRASH_POINTS[crash_at - 1]
    assert account["ok"] is True
    assert account["checks"] == dict.fromkeys(CHECKS, True), account["details"]
    killed, resumed = account["runs"]
    assert killed["killed_at"] == crash_at and killed["exit_code"] == -9
    assert resumed["killed_at"] is None and resumed["exit_code"] == 0
    assert account["crash_label"] == point.label

    effects = account["effects"]
    assert (effects["edit"], effects["release"]) == (1, 1)  # never twice, never skipped
    # Idempotent tools run again only when the kill came after they ran and before their result was kept.
    assert effects["read_log"] == (2 if point is agent.LOG_READ else 1)
    assert effects["run_tests"] == (2 if point is agent.TESTS_RAN else 1)

    recovery = resumed["recovery"]
    assert recovery["steps_in_doubt"] == ([point.in_doubt] if point.in_doubt else [])
    assert recovery["orphaned_tool_calls"] == (["call_read_log"] if point is agent.CALL_SAVED else [])
    if point in (agent.ASKED, agent.PENDING):
        assert len(recovery["pending_approvals"]) == 1  # asked once, decided after the restart
    else:
        assert recovery["pending_approvals"] == []
    outcomes = {r["resolved"]: r["outcome"] for r in resumed["resolved"]}
    assert outcomes == ({point.in_doubt: RESOLVED[point]} if point in RESOLVED else {})
    assert account["acknowledged"]["message"] >= 2


def test_demo_story_json_account_has_a_stable_shape(tmp_path: Path) -> None:
    account = story_json("--seed", "7", cwd=tmp_path)
    assert set(account) == {
        "ok",
        "store",
        "workspace",
        "seed",
        "crash_at",
        "crash_points",
        "crash_label",
        "runs",
        "effects",
        "acknowledged",
        "checks",
        "details",
        "elapsed_s",
    }
    assert account["seed"] == 7
    assert account["crash_at"] == random.Random(7).randint(1, POINTS)
    assert account["crash_points"] == POINTS
    assert set(account["checks"]) == set(account["details"]) == CHECKS
    assert set(account["effects"]) == {"read_log", "edit", "run_tests", "release"}
    assert set(account["acknowledged"]) >= {"message", "step", "file", "memory", "approval", "span", "task"}
    for run in account["runs"]:
        assert set(run) == {"pid", "killed_at", "exit_code", "recovery", "resolved"}
    assert account["store"].endswith("state.db (temporary)")
    assert isinstance(account["elapsed_s"], float)
    assert list(tmp_path.iterdir()) == []  # it worked in a temporary directory, and removed it


def test_demo_story_tells_what_happens_in_the_terminal_and_keeps_its_workspace(tmp_path: Path) -> None:
    crash_at = agent.CRASH_POINTS.index(agent.EDIT_DONE) + 1
    result = run_statekeel("demo", "--crash-at", str(crash_at), "--keep", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = " ".join(result.stdout.split())  # rich wraps lines at 80 columns without a terminal
    assert f"crash at point {crash_at} of {POINTS}" in out
    assert f"SIGKILL at point {crash_at}: {agent.EDIT_DONE.label}" in out
    assert "recover(): 1 tool call in doubt (call_edit); 1 step in doubt ('edit calc/__init__.py')" in out
    assert "'edit calc/__init__.py' was in doubt; the file already holds the fix: resolved succeeded" in out
    assert "released 0.1.1" in out
    assert "ok: every check passed" in out
    for name in CHECKS:
        assert f"✓ {name} " in out

    # --keep: the project as the agent left it, owner-only, with the database next to it.
    found = re.search(r"store (\S+)/state\.db", out)
    assert found, out
    tmpdir = Path(found.group(1))
    try:
        root = tmpdir / ws.PROJECT
        assert (root / "VERSION").read_text() == "0.1.1\n"
        assert ws.FIXED_LINE in (root / ws.CALC_PATH).read_text()
        assert ws.read_effects(root) == {"read_log": 1, "edit": 1, "run_tests": 1, "release": 1}
        assert stat.S_IMODE(tmpdir.stat().st_mode) == 0o700
        assert stat.S_IMODE((tmpdir / "state.db").stat().st_mode) == 0o600
        assert stat.S_IMODE((root / ws.CALC_PATH).stat().st_mode) == 0o600
    finally:
        shutil.rmtree(tmpdir)


Tamper = Callable[[Store, Path, str], Awaitable[None]]


async def _run_an_effect_again(store: Store, root: Path, run_id: str) -> None:
    ws.count_effect(root, "release")


async def _lose_an_acknowledged_memory(store: Store, root: Path, run_id: str) -> None:
    page = await store.memory.query(scope=agent.names(run_id)["scope"])
    for memory in page.items:
        await store.memory.forget(memory.id, reason="tampered by the test", actor="test")


async def _leave_a_call_unanswered(store: Store, root: Path, run_id: str) -> None:
    session = await store.sessions.get_or_create(agent.names(run_id)["session"])
    session.add_message("assistant", None, tool_calls=[agent.model([])["tool_calls"][0] | {"id": "call_x"}])
    await store.sessions.save(session)


async def _break_the_fix(store: Store, root: Path, run_id: str) -> None:
    path = root / ws.CALC_PATH
    path.write_text(path.read_text().replace(ws.FIXED_LINE, ws.BUGGY_LINE))


@pytest.mark.parametrize(
    ("tamper", "failing"),
    [
        (_run_an_effect_again, "effects_exactly_once"),
        (_lose_an_acknowledged_memory, "acknowledged_writes_survived"),
        (_leave_a_call_unanswered, "transcript_valid"),
        (_break_the_fix, "tests_pass"),
    ],
)
def test_demo_story_exits_non_zero_when_a_check_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tamper: Tamper, failing: str
) -> None:
    """The real demo, with the world or the store changed between the agent's end and the checks."""
    real = story.verify_story
    tampered: list[str] = []

    async def tamper_then_verify(store: Store, root: Path, run_id: str, *args: Any) -> Any:
        await tamper(store, root, run_id)
        tampered.append(run_id)
        return await real(store, root, run_id, *args)

    monkeypatch.setattr(story, "verify_story", tamper_then_verify)
    db = tmp_path / "d.db"
    result = CliRunner().invoke(main, ["demo", "--json", "--crash-at", "5", "--db", f"sqlite:///{db}"])
    assert tampered, result.output
    assert result.exit_code == 1, result.output
    account = json.loads(result.output)
    assert account["ok"] is False
    assert account["checks"][failing] is False, account["details"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--crash-at", "999"], f"--crash-at must be between 1 and {POINTS}, got 999"),
        (["--crash-at", "0"], f"--crash-at must be between 1 and {POINTS}, got 0"),
        (["--crash-at", "two"], "--crash-at must be an integer, got 'two'"),
        (["--seed", "x"], "--seed must be an integer, got 'x'"),
        (["--stress", "--crash-at", "3"], "--crash-at and --json belong to the story demo, not to --stress"),
        (["--cycles", "2"], "--sessions and --cycles belong to --stress"),
    ],
)
def test_demo_refuses_bad_input_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = run_statekeel("demo", *args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == f"statekeel demo: {message}\n"
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.postgres
def test_demo_story_runs_on_postgres(tmp_path: Path, pg_database: str) -> None:
    crash_at = agent.CRASH_POINTS.index(agent.RELEASED) + 1
    # SQLAlchemy's spelling, accepted by the demo as by every other command.
    url = pg_database.replace("postgresql://", "postgresql+asyncpg://", 1)
    account = story_json("--crash-at", str(crash_at), "--db", url, cwd=tmp_path)
    assert account["checks"] == dict.fromkeys(CHECKS, True), account["details"]
    assert account["effects"]["release"] == 1
    assert account["runs"][1]["recovery"]["steps_in_doubt"] == [agent.STEP_RELEASE]
    assert account["store"].startswith("postgresql://")


async def test_demo_story_leaves_each_kind_of_state_in_the_store(
    tmp_path: Path, provider_types: dict[Dialect, pydantic.TypeAdapter[Any]]
) -> None:
    """After a kill before the first tool ran (its call answered 'interrupted', then asked again), the
    store holds what an agent run leaves: a transcript OpenAI's own types accept, the trace, the memory,
    the file ledger, one approval used once, and its audit entries."""
    db = tmp_path / "state.db"
    crash_at = agent.CRASH_POINTS.index(agent.CALL_SAVED) + 1
    story_json("--crash-at", str(crash_at), "--db", f"sqlite:///{db}", cwd=tmp_path)
    async with statekeel.open_store(f"sqlite:///{db}") as store:
        (record,) = (await store.sessions.list()).items
        session = await store.sessions.load(record.key)
        assert session is not None
        assert_accepted(provider_types, CHAT, session.messages)
        assert_accepted(provider_types, CHAT, session.history(), window=True)
        calls = [c["id"] for m in session.messages for c in m.get("tool_calls") or ()]
        assert calls == ["call_read_log", "call_read_log-again", "call_edit", "call_tests", "call_release"]
        assert session.messages[2] == {
            "role": "tool",
            "tool_call_id": "call_read_log",
            "content": INTERRUPTED_TEXT,
        }

        spans = await store.traces.get(record.key)
        assert {s.name for s in spans} == {"agent run", "read_log", "edit_file", "run_tests", "shell"}
        assert len([s for s in spans if s.name == "agent run"]) == 2  # one per process; the killed one open
        assert all(s.ended_at is not None for s in spans if s.kind == "tool")

        memories = (await store.memory.query(type="semantic")).items
        assert [m.key for m in memories] == ["calc.add"]
        assert [r.path for r in await store.files.list()] == [ws.CALC_PATH, "VERSION", "CHANGELOG.md"]
        entries = [e for e in await store.audit.query(limit=1000) if e.kind.startswith("approval.")]
        assert [e.kind for e in entries] == ["approval.requested", "approval.granted", "approval.consumed"]
        audited = {e.kind for e in await store.audit.query(limit=1000)}
        assert {"task.created", "task.transitioned"} <= audited  # task changes are audited too
        approval = await store.approvals.get(entries[0].data["approval_id"])
        assert approval is not None
        assert approval.args == {"argv": list(ws.RELEASE_ARGV)}
        assert approval.consumed_by == agent.AGENT
