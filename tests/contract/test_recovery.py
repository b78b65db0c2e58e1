"""store.recover(): what a restarted agent needs to know and repair, on every backend."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import sqlite3
from pathlib import Path

import pytest

import statekeel
from statekeel.recovery import INTERRUPTED_CONTENT


def _assistant_calls(*ids: str) -> dict[str, object]:
    return {
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "run", "arguments": "{}"}} for i in ids
        ]
    }


async def _session_with_unanswered_call(store: statekeel.Store, key: str) -> None:
    session = await store.sessions.get_or_create(key)
    session.add_message("user", "run the tests and the linter")
    session.add_message("assistant", None, **_assistant_calls("c1", "c2"))
    session.add_message("tool", "3 passed", tool_call_id="c1")
    await store.sessions.save(session)


async def test_recover_answers_orphaned_tool_calls_with_an_interrupted_result(store: statekeel.Store) -> None:
    await _session_with_unanswered_call(store, "agent-1")
    report = await store.recover()
    assert report.orphaned_tool_calls == {"agent-1": ["c2"]}
    reloaded = await store.sessions.load("agent-1")
    assert reloaded is not None
    last = reloaded.messages[-1]
    assert last["role"] == "tool" and last["tool_call_id"] == "c2"
    assert last["content"] == INTERRUPTED_CONTENT
    assert [m.seq for m in await store.backend.read_messages("agent-1")] == [0, 1, 2, 3]


async def test_recover_is_idempotent(store: statekeel.Store) -> None:
    await _session_with_unanswered_call(store, "agent-1")
    await store.recover()
    head = (await store.backend.load_session("agent-1")).head_seq  # type: ignore[union-attr]
    second = await store.recover()
    assert second.orphaned_tool_calls == {}
    assert second.interrupted_tasks == []
    assert (await store.backend.load_session("agent-1")).head_seq == head  # type: ignore[union-attr]


async def test_recover_without_repair_writes_nothing(store: statekeel.Store) -> None:
    await _session_with_unanswered_call(store, "agent-1")
    task = await store.tasks.create("build", status="queued")
    claimed = await store.tasks.claim("w1", lease_seconds=30)
    assert claimed is not None and claimed.id == task.id
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    report = await store.recover(repair=False, now=later)
    assert report.orphaned_tool_calls == {"agent-1": ["c2"]}
    assert [t.id for t in report.interrupted_tasks] == [task.id]
    assert (await store.backend.load_session("agent-1")).head_seq == 3  # type: ignore[union-attr]
    current = await store.tasks.get(task.id)
    assert current is not None and current.status == "running"


async def test_recover_interrupts_running_tasks_whose_lease_expired(store: statekeel.Store) -> None:
    expired = await store.tasks.create("expired", status="queued")
    await store.tasks.claim("w1", lease_seconds=30)
    live = await store.tasks.create("live", status="queued")
    await store.tasks.claim("w2", lease_seconds=3600)
    report = await store.recover(now=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5))
    assert [t.id for t in report.interrupted_tasks] == [expired.id]
    assert (await store.tasks.get(expired.id)).status == "interrupted"  # type: ignore[union-attr]
    assert (await store.tasks.get(live.id)).status == "running"  # type: ignore[union-attr]


async def test_recover_lists_what_needs_a_decision(store: statekeel.Store) -> None:
    approval = await store.approvals.request("repo", "deploy", {"env": "prod"}, "agent")
    wf = await store.workflows.create("ship", [{"name": "build"}, {"name": "test", "depends_on": ["build"]}])
    await store.workflows.start(wf.id)
    report = await store.recover()
    assert [a.id for a in report.pending_approvals] == [approval.id]
    assert [w.id for w in report.unfinished_workflows] == [wf.id]
    assert report.audit is not None and report.audit.ok
    assert report.ok
    assert report.summary()["pending_approvals"] == 1


async def test_recover_leaves_sessions_held_by_a_live_agent_alone(store: statekeel.Store) -> None:
    await _session_with_unanswered_call(store, "agent-1")
    lock = store.sessions.lock("agent-1")
    await lock.acquire()
    try:
        report = await asyncio.create_task(store.recover())
    finally:
        await lock.release()
    assert report.sessions_busy == ["agent-1"]
    assert report.orphaned_tool_calls == {}
    assert (await store.backend.load_session("agent-1")).head_seq == 3  # type: ignore[union-attr]


# One session that cannot be loaded stops neither the repair of the others nor the rest of the recovery
# (task leases, the report).
async def test_a_session_with_a_damaged_history_is_reported_and_recovery_goes_on(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    url = f"sqlite:///{db}"
    async with statekeel.open_store(url) as store:
        for key in ("a-first", "damaged", "z-last"):
            session = await store.sessions.get_or_create(key)
            session.add_message("user", "run the tests")
            session.add_message("assistant", None, tool_calls=[{"id": "c1", "type": "function"}])
            await store.sessions.save(session)
        task = await store.tasks.create("build", status="queued")
        assert await store.tasks.claim("w1", lease_seconds=30) is not None
    # A gap in the stored history (seq 0 lost outside statekeel): loading it is StorageCorrupt.
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("DELETE FROM messages WHERE session_key = 'damaged' AND seq = 0")
    conn.close()
    async with statekeel.open_store(url) as store:
        later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
        report = await store.recover(now=later)  # reports the damaged session instead of raising
        assert report.orphaned_tool_calls == {"a-first": ["c1"], "z-last": ["c1"]}
        assert list(report.sessions_failed) == ["damaged"]
        assert "damaged" in report.sessions_failed["damaged"]
        assert not report.ok and report.summary()["sessions_failed"] == 1
        assert [t.id for t in report.interrupted_tasks] == [task.id]  # the task recovery still ran
        for key in ("a-first", "z-last"):
            s = await store.sessions.load(key)
            assert s is not None and s.messages[-1]["content"] == INTERRUPTED_CONTENT
        record = await store.backend.load_session("damaged")
        assert record is not None and record.head_seq == 2  # nothing was written to it


async def test_recover_lists_open_contradictions_and_files_that_drifted(
    store: statekeel.Store, tmp_path: Path
) -> None:
    a = await store.memory.put("user", "diet", "vegan")
    b = await store.memory.put("user", None, "ordered a steak")
    opened = await store.memory.record_contradiction(a.id, b.id, "diet vs. order")
    settled = await store.memory.record_contradiction(a.id, b.id, "old news")
    await store.memory.resolve_contradiction(settled.id, "settled")
    (tmp_path / "kept.txt").write_bytes(b"same")
    await store.files.record("kept.txt", hashlib.sha256(b"same").hexdigest(), 4)
    await store.files.record("lost.txt", hashlib.sha256(b"x").hexdigest(), 1)

    report = await store.recover(files_root=tmp_path)
    assert [c.id for c in report.open_contradictions] == [opened.id]
    assert [(d.path, d.kind) for d in report.drifted_files] == [("lost.txt", "missing")]
    assert report.summary()["open_contradictions"] == 1
    assert report.ok  # both need a decision, neither is damage
    without_root = await store.recover(repair=False)
    assert without_root.drifted_files == [] and len(without_root.open_contradictions) == 1


async def test_recover_checks_every_argument_before_writing_anything(store: statekeel.Store) -> None:
    await _session_with_unanswered_call(store, "agent-1")
    await store.tasks.create("build", status="queued")
    claimed = await store.tasks.claim("w1", lease_seconds=1)
    assert claimed is not None
    bad_arguments: list[dict[str, object]] = [
        {"now": "2026-01-01T00:00:00Z"},
        {"now": dt.datetime(2099, 1, 1)},  # naive: whose clock?
        {"now": 1767225600},
        {"repair": "yes"},
        {"repair": None},
    ]
    for bad in bad_arguments:
        with pytest.raises(statekeel.InvalidArgument):
            await store.recover(**bad)  # type: ignore[arg-type]
    # Nothing was repaired: the orphaned call is unanswered, the expired task still running.
    assert (await store.backend.load_session("agent-1")).head_seq == 3  # type: ignore[union-attr]
    assert (await store.tasks.get(claimed.id)).status == "running"  # type: ignore[union-attr]
    report = await store.recover(now=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5))
    assert report.orphaned_tool_calls == {"agent-1": ["c2"]}
    assert [t.id for t in report.interrupted_tasks] == [claimed.id]
