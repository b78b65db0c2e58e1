"""``statekeel steps resolve``, ``calls resolve``, ``approvals list|decide``, ``tasks requeue|cancel`` and
the commands ``recover`` names, as an operator runs them: subprocesses against a store on SQLite and
PostgreSQL; the state change, its audit entry naming the actor, and the refusals (one line, exit 1, nothing
written)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import statekeel
from helpers import one_line_error, run_statekeel


@dataclass
class Seeded:
    url: str
    task_id: str  # interrupted (its worker's lease ran out), step "charge" started and never finished
    approval_id: str  # pending
    session: str  # an assistant turn whose tool call "call_1" has no result
    done_task: str  # succeeded


def seed(url: str) -> Seeded:
    async def fill() -> Seeded:
        async with statekeel.open_store(url) as store:
            await store.tasks.create("charge the card", status="queued")
            claimed = await store.tasks.claim("worker-gone", lease_seconds=60)
            assert claimed is not None
            with pytest.raises(statekeel.StatekeelError):
                # The step ran, its value could not be stored: started, never finished.
                await store.tasks.step(claimed.id, "charge", lambda: {1}, lease_epoch=claimed.lease_epoch)
            # The worker is gone: its lease is over by the clock an hour later.
            await store.tasks.expire_leases(now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
            approval = await store.approvals.request("task:1", "shell", {"cmd": "make"}, "agent-7")
            async with store.sessions.open("chat-1") as session:
                session.add_message("user", "deploy it")
                session.add_message(
                    "assistant",
                    None,
                    tool_calls=[{"id": "call_1", "type": "function", "function": {"name": "deploy"}}],
                )
            done = await store.tasks.create("lint")
            await store.tasks.transition(done.id, "running")
            await store.tasks.transition(done.id, "success")
            return Seeded(url, claimed.id, approval.id, "chat-1", done.id)

    return asyncio.run(fill())


async def _read(url: str, what: Any) -> Any:
    async with statekeel.open_store(url, migrate=False) as store:
        return await what(store)


def read(url: str, what: Any) -> Any:
    return asyncio.run(_read(url, what))


def entries(url: str, subject: str) -> list[Any]:
    return list(read(url, lambda s: s.audit.query(subject=subject, limit=1000)))


@pytest.fixture
def seeded(shared_url: str) -> Seeded:
    return seed(shared_url)


def sk(seeded: Seeded, tmp_path: Path, *args: str, user: str | None = "ops") -> Any:
    env = {} if user is None else {"USER": user}
    return run_statekeel(*args, "--db", seeded.url, cwd=tmp_path, env=env)


def test_steps_resolve_settles_a_step_in_doubt_and_audits_the_actor(seeded: Seeded, tmp_path: Path) -> None:
    result = sk(
        seeded, tmp_path, "steps", "resolve", seeded.task_id, "charge", "--succeeded", "--result",
        '{"charged": 12}', "--actor", "alice",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "succeeded (by alice)" in result.stdout
    step = read(seeded.url, lambda s: s.tasks.get_step(seeded.task_id, "charge"))
    assert step.status == "succeeded"
    [entry] = [e for e in entries(seeded.url, f"task:{seeded.task_id}") if e.kind == "task.step.resolved"]
    assert entry.actor == "alice" and entry.data["step_key"] == "charge"
    # Settled: a second resolution is refused and changes nothing.
    again = sk(seeded, tmp_path, "steps", "resolve", seeded.task_id, "charge", "--failed")
    assert "not in doubt" in one_line_error(again) and again.returncode == 1
    assert read(seeded.url, lambda s: s.tasks.get_step(seeded.task_id, "charge")).status == "succeeded"


def test_steps_resolve_failed_records_the_error_and_defaults_the_actor_to_user(
    seeded: Seeded, tmp_path: Path
) -> None:
    result = sk(seeded, tmp_path, "steps", "resolve", seeded.task_id, "charge", "--failed", "--error", "no")
    assert result.returncode == 0, result.stderr
    step = read(seeded.url, lambda s: s.tasks.get_step(seeded.task_id, "charge"))
    assert step.status == "failed"
    [entry] = [e for e in entries(seeded.url, f"task:{seeded.task_id}") if e.kind == "task.step.resolved"]
    assert entry.actor == "ops"


def test_steps_resolve_refuses_a_step_under_a_live_lease_unless_forced(
    shared_url: str, tmp_path: Path
) -> None:
    async def fill() -> str:
        async with statekeel.open_store(shared_url) as store:
            await store.tasks.create("long", status="queued")
            task = await store.tasks.claim("worker-live", lease_seconds=3600)
            assert task is not None
            with pytest.raises(statekeel.StatekeelError):
                await store.tasks.step(task.id, "push", lambda: {1}, lease_epoch=task.lease_epoch)
            return task.id

    task_id = asyncio.run(fill())
    seeded = Seeded(shared_url, task_id, "", "", "")
    refused = sk(seeded, tmp_path, "steps", "resolve", task_id, "push", "--failed")
    assert "live lease" in one_line_error(refused)
    assert read(shared_url, lambda s: s.tasks.get_step(task_id, "push")).status == "started"
    forced = sk(seeded, tmp_path, "steps", "resolve", task_id, "push", "--failed", "--force")
    assert forced.returncode == 0, forced.stderr
    [entry] = [e for e in entries(shared_url, f"task:{task_id}") if e.kind == "task.step.resolved"]
    assert entry.data["forced"] is True and entry.data["lease_owner"] == "worker-live"


def test_an_action_without_actor_or_user_is_refused_before_anything_is_written(
    seeded: Seeded, tmp_path: Path
) -> None:
    result = sk(seeded, tmp_path, "tasks", "requeue", seeded.task_id, user=None)
    assert "--actor" in one_line_error(result)
    assert read(seeded.url, lambda s: s.tasks.get(seeded.task_id)).status == "interrupted"


def test_usage_mistakes_are_one_line_usage_errors(seeded: Seeded, tmp_path: Path) -> None:
    for args in (
        ("steps", "resolve", seeded.task_id, "charge"),
        ("steps", "resolve", seeded.task_id, "charge", "--succeeded", "--result", "{not json"),
        ("calls", "resolve", seeded.session, "call_1"),
        ("approvals", "decide", seeded.approval_id),
    ):
        result = sk(seeded, tmp_path, *args)
        one_line_error(result)
        assert result.returncode == 2, args
    assert read(seeded.url, lambda s: s.tasks.get_step(seeded.task_id, "charge")).status == "started"


def test_calls_resolve_answers_a_waiting_call_by_session_key_with_an_audit_entry(
    seeded: Seeded, tmp_path: Path
) -> None:
    result = sk(seeded, tmp_path, "calls", "resolve", seeded.session, "call_1", "--result", "deployed v2")
    assert result.returncode == 0, result.stderr
    session = read(seeded.url, lambda s: s.sessions.load(seeded.session, repair=False))
    assert session.messages[-1]["role"] == "tool" and session.messages[-1]["tool_call_id"] == "call_1"
    assert "deployed v2" in json.dumps(session.messages[-1])
    [entry] = [e for e in entries(seeded.url, f"session:{seeded.session}") if e.kind == "tool_call.resolved"]
    assert entry.actor == "ops" and entry.data["call_id"] == "call_1" and entry.data["answer"] == "result"
    again = sk(seeded, tmp_path, "calls", "resolve", seeded.session, "call_1", "--interrupted")
    assert "call_1" in one_line_error(again)
    assert len(read(seeded.url, lambda s: s.sessions.load(seeded.session, repair=False)).messages) == len(
        session.messages
    )


def test_calls_resolve_interrupted_and_an_unknown_session_is_refused(seeded: Seeded, tmp_path: Path) -> None:
    result = sk(seeded, tmp_path, "calls", "resolve", seeded.session, "call_1", "--interrupted")
    assert result.returncode == 0, result.stderr
    [entry] = [e for e in entries(seeded.url, f"session:{seeded.session}") if e.kind == "tool_call.resolved"]
    assert entry.data["answer"] == "interrupted"
    missing = sk(seeded, tmp_path, "calls", "resolve", "no-such-session", "call_1", "--interrupted")
    assert "does not exist" in one_line_error(missing)
    assert read(seeded.url, lambda s: s.sessions.load("no-such-session", repair=False)) is None


def test_approvals_list_then_decide_once_audited_with_the_actor(seeded: Seeded, tmp_path: Path) -> None:
    listed = sk(seeded, tmp_path, "approvals", "list", "--json")
    assert [a["id"] for a in json.loads(listed.stdout)] == [seeded.approval_id]
    assert seeded.approval_id in sk(seeded, tmp_path, "approvals", "list").stdout
    result = sk(
        seeded, tmp_path, "approvals", "decide", seeded.approval_id, "--deny", "--reason", "not now",
        "--actor", "bob",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = read(seeded.url, lambda s: s.approvals.get(seeded.approval_id))
    assert (record.status, record.decided_by, record.reason) == ("denied", "bob", "not now")
    [entry] = [e for e in entries(seeded.url, "task:1") if e.kind == "approval.denied"]
    assert entry.actor == "bob"
    again = sk(seeded, tmp_path, "approvals", "decide", seeded.approval_id, "--grant")
    assert "already" in one_line_error(again)
    assert read(seeded.url, lambda s: s.approvals.get(seeded.approval_id)).status == "denied"
    assert "no approval is waiting" in sk(seeded, tmp_path, "approvals", "list").stdout


def test_tasks_requeue_and_cancel_change_the_status_with_their_audit_entries(
    seeded: Seeded, tmp_path: Path
) -> None:
    requeued = sk(seeded, tmp_path, "tasks", "requeue", seeded.task_id, "--actor", "carol")
    assert requeued.returncode == 0, requeued.stderr
    assert read(seeded.url, lambda s: s.tasks.get(seeded.task_id)).status == "queued"
    refused = sk(seeded, tmp_path, "tasks", "requeue", seeded.task_id)
    assert "cannot become queued" in one_line_error(refused)
    cancelled = sk(seeded, tmp_path, "tasks", "cancel", seeded.task_id, "--reason", "duplicate")
    assert cancelled.returncode == 0, cancelled.stderr
    assert read(seeded.url, lambda s: s.tasks.get(seeded.task_id)).status == "cancelled"
    moves = [e for e in entries(seeded.url, f"task:{seeded.task_id}") if e.kind == "task.transitioned"]
    by_via = {e.data["via"]: e for e in moves}
    assert by_via["requeue"].actor == "carol" and by_via["requeue"].data["to"] == "queued"
    assert by_via["cancel"].actor == "ops" and by_via["cancel"].data["reason"] == "duplicate"
    for args in (("cancel", seeded.done_task, "--reason", "x"), ("requeue", seeded.done_task)):
        one_line_error(sk(seeded, tmp_path, "tasks", *args))
    assert read(seeded.url, lambda s: s.tasks.get(seeded.done_task)).status == "success"
    assert "does not exist" in one_line_error(sk(seeded, tmp_path, "tasks", "requeue", "nope"))


def test_recover_names_each_item_with_the_command_that_settles_it(seeded: Seeded, tmp_path: Path) -> None:
    text = sk(seeded, tmp_path, "recover")
    assert text.returncode == 1, text.stdout + text.stderr
    report = json.loads(sk(seeded, tmp_path, "recover", "--json").stdout)
    commands = {item["kind"]: item["commands"] for item in report["settle"]}
    db = f"--db {seeded.url}"
    assert commands["step_in_doubt"] == [
        f"statekeel steps resolve {seeded.task_id} charge {db} --failed",
        f"statekeel steps resolve {seeded.task_id} charge {db} --succeeded --result JSON",
    ]
    assert commands["pending_approval"][0] == f"statekeel approvals decide {seeded.approval_id} {db} --grant"
    for kind_commands in commands.values():
        for command in kind_commands:
            assert command in text.stdout
    # The commands recover named settle what it reported: run them, and nothing is left to decide.
    for command in (commands["step_in_doubt"][0], commands["pending_approval"][0]):
        done = run_statekeel(*command.split()[1:], cwd=tmp_path, env={"USER": "ops"})
        assert done.returncode == 0, done.stderr
    after = json.loads(sk(seeded, tmp_path, "recover", "--json").stdout)
    kinds = {item["kind"] for item in after["settle"]}
    assert "step_in_doubt" not in kinds and "pending_approval" not in kinds
