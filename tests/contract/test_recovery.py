"""store.recover(): what a restarted agent needs to know and repair, on every backend."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import sqlite3
from pathlib import Path

import pytest

import statekeel
from statekeel.fallback import FallbackDir, FallbackSnapshot
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


@pytest.mark.kinds("sessions", "tool_calls", "audit")  # what a plain NATS store holds
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


@pytest.mark.kinds("sessions", "tool_calls", "audit")  # what a plain NATS store holds
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
    live = await store.tasks.create("live", status="queued")
    assert await store.tasks.claim("w2", lease_seconds=3600) is not None
    entries = (await store.audit.verify()).count
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    report = await store.recover(repair=False, now=later)
    assert report.orphaned_tool_calls == {"agent-1": ["c2"]}
    assert [t.id for t in report.interrupted_tasks] == [task.id]  # not the live one
    assert any("would be moved to interrupted" in a for a in report.advice)
    assert (await store.audit.verify()).count == entries
    assert (await store.tasks.get(live.id)).status == "running"  # type: ignore[union-attr]
    assert (await store.backend.load_session("agent-1")).head_seq == 3  # type: ignore[union-attr]
    current = await store.tasks.get(task.id)
    assert current is not None and current.status == "running"


def _file_bytes(files: FallbackDir) -> dict[str, bytes]:
    """Every fallback file's bytes, by path."""
    return {path: Path(path).read_bytes() for path in files.files()}


async def test_recover_without_repair_writes_nothing_even_when_evicting_sessions_merged_from_fallback_files(
    store: statekeel.Store,
) -> None:
    files = store.sessions.fallback
    assert files is not None
    keys = [f"agent-{i}" for i in range(4)]
    for key in keys:
        await _session_with_unanswered_call(store, key)
        record = await store.backend.load_session(key)
        assert record is not None
        # An outage's save of a metadata change, only in its fallback file: a load merges it as unsaved.
        files.write(
            FallbackSnapshot(
                key=key,
                base_head=record.head_seq,
                in_backend=True,
                status="active",
                metadata={"topic": "outage"},
                status_changed=False,
                metadata_changed=True,
                last_consolidated=0,
                created_at=record.created_at,
                updated_at=record.updated_at,
                messages=[],
            )
        )
    before = {key: await store.backend.load_session(key) for key in keys}
    on_disk = _file_bytes(files)
    store.sessions.cache_size = 1  # more waiting sessions than the cache holds: recover evicts
    store.sessions._cache.clear()
    report = await store.recover(repair=False)
    assert report.orphaned_tool_calls == {key: ["c2"] for key in keys}
    assert {key: await store.backend.load_session(key) for key in keys} == before  # no row written
    assert _file_bytes(files) == on_disk  # nor any file
    again = await store.sessions.load(keys[0], repair=False)
    assert again is not None and again.metadata == {"topic": "outage"} and again.is_dirty()


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


@pytest.mark.kinds("sessions", "tool_calls", "audit")  # what a plain NATS store holds
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
        {"check_integrity": "no"},
        {"files_root": 42},
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


def _embed(texts: list[str]) -> list[list[float]]:
    """A small deterministic embedder: the text's length and its count of two letters."""
    return [[len(t) + 1.0, float(t.count("a")), float(t.count("e"))] for t in texts]


def _span(n: int) -> dict[str, object]:
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=n)
    return {"span_id": f"s{n:05d}", "name": "tool", "kind": "tool", "started_at": at, "ended_at": at}


async def test_recover_counts_the_spans_a_full_trace_buffer_dropped_and_says_they_are_lost(
    store: statekeel.Store,
) -> None:
    # Nothing yields in between, so the background writer takes none of them: the 3 oldest are dropped.
    for n in range(10_003):
        store.traces.record("t", _span(n))
    first = await store.recover()
    assert first.traces_dropped == 3 and first.summary()["traces_dropped"] == 3
    assert any("3 span(s) were dropped" in a for a in first.advice)
    assert first.ok  # lost spans are reported, not damage
    await store.traces.flush()
    second = await store.recover()  # nothing to repair: the same count, no new loss
    assert second.traces_dropped == 3 and second.advice == first.advice


async def test_recover_counts_lagging_vectors_until_a_rebuild_catches_up(store: statekeel.Store) -> None:
    await store.memory.put("semantic", "tea", "green tea is brewed at 80 degrees")
    await store.memory.put("semantic", "coffee", "espresso needs fine grounds")
    await store.vectors.source_changed("doc-1", 1)
    first = await store.recover()
    assert first.lagging_vectors == 3 and first.summary()["lagging_vectors"] == 3
    assert any("vectors.rebuild" in a for a in first.advice) and first.ok
    again = await store.recover()
    assert again.lagging_vectors == 3  # recovery reports the lag; only a rebuild (derived tier) closes it
    assert await store.vectors.rebuild(_embed, model="m", text_for=lambda s: "the document") == 3
    caught_up = await store.recover()
    assert caught_up.lagging_vectors == 0 and not any("vectors" in a for a in caught_up.advice)
    await store.memory.put("semantic", "tea", "green tea is brewed at 75 degrees")  # a new version
    assert (await store.recover()).lagging_vectors == 1


async def test_recover_lists_files_whose_bytes_changed_since_the_ledger_recorded_them(
    store: statekeel.Store, tmp_path: Path
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_bytes(b"print('v1')\n")
    (tmp_path / "notes.txt").write_bytes(b"kept")
    await store.files.record("src/app.py", hashlib.sha256(b"print('v1')\n").hexdigest(), 12)
    await store.files.record("notes.txt", hashlib.sha256(b"kept").hexdigest(), 4)
    assert (await store.recover(files_root=tmp_path)).drifted_files == []
    (tmp_path / "src" / "app.py").write_bytes(b"print('edited by hand')\n")  # outside the agent

    report = await store.recover(files_root=tmp_path)
    [drift] = report.drifted_files
    assert (drift.path, drift.kind) == ("src/app.py", "changed")
    assert drift.checksum == hashlib.sha256(b"print('edited by hand')\n").hexdigest()
    assert any("1 file(s) no longer match the ledger (changed" in a for a in report.advice)
    again = await store.recover(files_root=tmp_path)
    assert [(d.path, d.kind) for d in again.drifted_files] == [("src/app.py", "changed")]
    # Recording what is there now settles it.
    await store.files.record("src/app.py", drift.checksum, drift.size)  # type: ignore[arg-type]
    assert (await store.recover(files_root=tmp_path)).drifted_files == []


async def test_recover_twice_the_second_run_repairs_nothing_and_lists_the_same_decisions(
    store: statekeel.Store, tmp_path: Path
) -> None:
    await _session_with_unanswered_call(store, "agent-1")
    await store.tasks.create("build", status="queued")
    claimed = await store.tasks.claim("w1", lease_seconds=1)
    assert claimed is not None
    a = await store.memory.put("user", "diet", "vegan")
    b = await store.memory.put("user", None, "ordered a steak")
    await store.memory.record_contradiction(a.id, b.id, "diet vs. order")
    await store.files.record("gone.txt", hashlib.sha256(b"x").hexdigest(), 1)
    for n in range(10_001):
        store.traces.record("t", _span(n))
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)

    first = await store.recover(now=later, files_root=tmp_path)
    assert first.orphaned_tool_calls == {"agent-1": ["c2"]}
    assert [t.id for t in first.interrupted_tasks] == [claimed.id]
    entries = (await store.audit.verify()).count
    second = await store.recover(now=later, files_root=tmp_path)

    assert second.orphaned_tool_calls == {} and second.interrupted_tasks == []
    assert (await store.audit.verify()).count == entries  # nothing was written by the second run
    assert [c.id for c in second.open_contradictions] == [c.id for c in first.open_contradictions]
    assert [(d.path, d.kind) for d in second.drifted_files] == [("gone.txt", "missing")]
    assert second.traces_dropped == first.traces_dropped == 1
    assert second.lagging_vectors == first.lagging_vectors == 2
    decisions = [a for a in first.advice if "answered" not in a and "interrupted" not in a]
    assert second.advice == decisions
    session = await store.sessions.load("agent-1")
    assert session is not None and [m.get("tool_call_id") for m in session.messages[-2:]] == ["c1", "c2"]


async def test_recover_without_the_integrity_check_says_so_and_does_the_rest(store: statekeel.Store) -> None:
    await _session_with_unanswered_call(store, "agent-1")
    report = await store.recover(check_integrity=False)
    assert not report.integrity_checked and report.summary()["integrity_checked"] is False
    assert report.orphaned_tool_calls == {"agent-1": ["c2"]}
    assert report.audit is not None and report.audit.ok
    assert (await store.recover()).integrity_checked


async def test_recover_and_health_report_a_call_followed_by_a_user_turn_until_it_is_answered(
    store: statekeel.Store,
) -> None:
    gone = statekeel.SessionManager(store.backend, store.codec)
    session = await gone.get_or_create("s")
    session.add_message("user", "run the tests")
    session.add_message("assistant", None, **_assistant_calls("c1"))
    await gone.save(session)
    session.add_message("user", "are you there?")  # the tool never ran; the user wrote again
    await gone.save(session)
    await gone.close()

    dry = await store.recover(repair=False)
    assert dry.orphaned_tool_calls == {"s": ["c1"]}
    health = await store.health()
    assert any(f.check == "tool calls" and f.severity == "problem" for f in health.findings)
    assert len(await store.backend.read_messages("s")) == 3  # neither wrote anything

    report = await store.recover()
    assert report.orphaned_tool_calls == {"s": ["c1"]}
    last = (await store.backend.read_messages("s"))[-1]
    assert last.payload == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": INTERRUPTED_CONTENT,
    }
    assert (await store.recover()).orphaned_tool_calls == {}
    assert not any(f.check == "tool calls" for f in (await store.health()).findings)
