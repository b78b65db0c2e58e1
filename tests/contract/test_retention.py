"""Retention on every backend: ``store.purge()`` deletes what has aged past its ``Retention``, in batches,
with a dry run that writes nothing and reports the same counts — and never a protected row: audit entries,
approvals, unfinished tasks (and their workflows and parents), sessions that are not archived, memories of
an open contradiction, the history of live memories, the file ledger's last record of a path."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import statekeel
from statekeel.retention import purge

HOUR = dt.timedelta(hours=1)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def only(**ages: Any) -> statekeel.Retention:
    """A Retention that purges only the kinds given (the others are kept forever)."""
    base: dict[str, Any] = {"traces": None, "tasks": None, "sessions": None, "memories": None}
    return statekeel.Retention(**{**base, **ages})


async def table_counts(store: statekeel.Store) -> dict[str, int]:
    return {t.name: await store.backend.count_rows(t.name) for t in await store.backend.copy_tables()}


async def moment() -> dt.datetime:
    """A time strictly after everything written so far and before anything written next."""
    await asyncio.sleep(0.002)
    at = dt.datetime.now(dt.UTC)
    await asyncio.sleep(0.002)
    return at


async def purge_checked(store: statekeel.Store, retention: statekeel.Retention, now: dt.datetime) -> Any:
    """A dry run (nothing written), then the purge, which must delete exactly what the dry run said."""
    before = await table_counts(store)
    dry = await purge(store, retention, now, True)
    assert dry.dry_run and await table_counts(store) == before
    real = await purge(store, retention, now, False)
    assert real.counts == dry.counts
    return real


@pytest.mark.parametrize(
    "age", [-1, -0.5, dt.timedelta(seconds=-1), math.nan, math.inf, -math.inf, 1e300, "30d", True], ids=repr
)
def test_a_negative_or_non_finite_age_is_refused(age: Any) -> None:
    for kind in ("traces", "tasks", "sessions", "memories"):
        with pytest.raises(statekeel.InvalidArgument):
            statekeel.Retention(**{kind: age})


async def test_bad_retention_options_are_refused_before_anything_is_opened(tmp_path: Path) -> None:
    with pytest.raises(statekeel.InvalidArgument):
        statekeel.Retention(batch_size=0)
    with pytest.raises(statekeel.InvalidArgument):
        statekeel.open_store(f"sqlite:///{tmp_path / 'x.db'}", retention={"traces": 1})  # type: ignore[arg-type]
    assert not os.listdir(tmp_path)
    r = statekeel.Retention(traces=60, tasks=dt.timedelta(days=1), memories=0)
    assert r.traces == dt.timedelta(seconds=60) and r.memories == dt.timedelta(0)
    assert statekeel.Retention().traces == dt.timedelta(days=30)


async def test_store_purge_follows_the_retention_given_to_open_store(tmp_path: Path) -> None:
    retention = statekeel.Retention(traces=HOUR, tasks=None, sessions=None, memories=None, batch_size=3)
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'r.db'}", retention=retention) as store:
        assert store.options.retention is retention
        for n in range(7):
            store.traces.record("t", {"span_id": f"s{n}", "name": "x", "started_at": T0 + n * HOUR})
        await store.traces.flush()
        report = await store.purge(T0 + 5 * HOUR)
        assert (report.traces, report.batches) == (4, 2)
        assert [s.span_id for s in await store.traces.get("t")] == ["s4", "s5", "s6"]


async def test_bad_purge_arguments_are_refused(store: statekeel.Store) -> None:
    with pytest.raises(statekeel.InvalidArgument):
        await store.purge(now=dt.datetime(2026, 1, 1))  # naive
    with pytest.raises(statekeel.InvalidArgument):
        await store.purge(dry_run="yes")  # type: ignore[arg-type]


async def test_spans_past_their_ttl_are_purged_in_batches_and_younger_ones_stay(
    store: statekeel.Store,
) -> None:
    for n in range(25):
        store.traces.record("old", {"span_id": f"s{n:02d}", "name": "tool", "started_at": T0 + n * HOUR})
    store.traces.record("new", {"span_id": "s", "name": "tool", "started_at": T0 + 30 * HOUR})
    await store.traces.flush()
    retention = statekeel.Retention(traces=HOUR, tasks=None, sessions=None, memories=None, batch_size=4)
    report = await purge_checked(store, retention, T0 + 26 * HOUR)
    assert report.traces == 25 and report.batches >= 7 and report.longest_batch_seconds > 0
    assert await store.traces.get("old") == [] and len(await store.traces.get("new")) == 1
    # The store's own retention: 30 days by default, set by open_store(retention=...).
    assert (await store.purge(T0 + 40 * HOUR)).traces == 0
    assert (await store.purge(T0 + dt.timedelta(days=32))).traces == 1


async def test_finished_tasks_go_with_their_steps_and_unfinished_ones_stay(store: statekeel.Store) -> None:
    tasks = store.tasks
    done = await tasks.create("done")
    await tasks.transition(done.id, "running")
    await tasks.step(done.id, "fetch", lambda: 42)
    await tasks.transition(done.id, "success")
    failed = await tasks.create("failed")
    await tasks.transition(failed.id, "running")
    await tasks.transition(failed.id, "failed")
    cancelled = await tasks.create("cancelled")
    await tasks.transition(cancelled.id, "cancelled")
    running = await tasks.create("running")
    await tasks.transition(running.id, "running")
    pending = await tasks.create("pending")
    # A finished parent whose child still runs stays; a finished parent of a finished child goes after it.
    parent = await tasks.create("parent")
    child = await tasks.create("child", parent_task_id=parent.id)
    await tasks.transition(child.id, "running")
    await tasks.transition(parent.id, "cancelled")
    parent2 = await tasks.create("parent2")
    child2 = await tasks.create("child2", parent_task_id=parent2.id)
    await tasks.transition(parent2.id, "cancelled")
    await tasks.transition(child2.id, "cancelled")
    cutoff = await moment()
    late = await tasks.create("finished too recently")
    await tasks.transition(late.id, "cancelled")
    report = await purge_checked(store, only(tasks=HOUR, batch_size=2), cutoff + HOUR)
    assert (report.tasks, report.steps) == (5, 1)
    gone = {done.id, failed.id, cancelled.id, parent2.id, child2.id}
    for t in (done, failed, cancelled, parent2, child2):
        assert await tasks.get(t.id) is None
    for t in (running, pending, parent, child, late):
        kept = await tasks.get(t.id)
        assert kept is not None and kept.id not in gone
    kept_child = await tasks.get(child.id)
    assert kept_child is not None and kept_child.parent_task_id == parent.id
    assert await store.backend.list_steps(done.id) == []


async def test_a_workflow_goes_with_its_tasks_once_it_and_all_its_tasks_finished(
    store: statekeel.Store,
) -> None:
    finished = await store.workflows.create("finished", [{"name": "a"}, {"name": "b", "depends_on": ["a"]}])
    await store.workflows.cancel(finished.id)
    unfinished = await store.workflows.create("unfinished", [{"name": "a"}])
    await store.workflows.start(unfinished.id)
    cutoff = await moment()
    report = await purge_checked(store, only(tasks=HOUR), cutoff + HOUR)
    assert (report.workflows, report.tasks) == (1, 2)
    assert await store.workflows.get(finished.id) is None
    for step in finished.steps:
        assert await store.tasks.get(step.task.id) is None
    still = await store.workflows.get(unfinished.id)
    assert still is not None and len(still.steps) == 1 and await store.tasks.get(still.steps[0].task.id)


async def test_archived_sessions_go_with_their_messages_and_others_stay(store: statekeel.Store) -> None:
    sessions = store.sessions
    for key in ("archived", "active", "expired"):
        s = await sessions.get_or_create(key)
        for n in range(6):
            s.add_message("user", f"m{n}")
        await sessions.save(s)
    await sessions.compress("archived", 4, "summary")
    await sessions.archive("archived")
    await sessions.expire("expired")
    cutoff = await moment()
    young = await sessions.get_or_create("archived-recently")
    young.add_message("user", "hi")
    await sessions.save(young)
    await sessions.archive("archived-recently")
    report = await purge_checked(store, only(sessions=HOUR), cutoff + HOUR)
    assert (report.sessions, report.messages) == (1, 6)
    assert await store.backend.load_session("archived") is None
    assert await store.backend.read_archive("archived") == []
    for key in ("active", "expired", "archived-recently"):
        assert await store.backend.load_session(key) is not None
    assert len(await store.backend.read_messages("active")) == 6


async def test_forgotten_and_expired_memories_go_after_the_grace_period_with_their_vectors(
    store: statekeel.Store,
) -> None:
    mem = store.memory
    forgotten = await mem.put("user", "a", "alpha")
    await mem.forget(forgotten.id, reason="asked", actor="u")
    expired = await mem.put("user", "b", "beta", expires_at=dt.datetime.now(dt.UTC))
    disputed = await mem.put("user", "c", "gamma")
    live = await mem.put("user", "d", "delta")
    await mem.put("user", "d", "delta 2")  # live, with history
    await mem.record_contradiction(disputed.id, live.id, "they disagree")
    await mem.forget(disputed.id, reason="r", actor="u")  # forgotten, but an open contradiction names it
    mem.record_access(forgotten.id, "q")
    mem.record_access(live.id, "q")
    await mem.flush()
    for m in (forgotten, expired, disputed, live):
        await store.vectors.upsert(f"v-{m.id}", m.id, [1.0, 0.5], model="m", source_version=m.version)
    cutoff = await moment()
    recent = await mem.put("user", "e", "eps")
    await mem.forget(recent.id, reason="r", actor="u")
    report = await purge_checked(store, only(memories=HOUR), cutoff + HOUR)
    assert (report.memories, report.memory_accesses, report.vectors) == (2, 1, 2)
    assert report.memory_events == 3  # ADD + DELETE of one, ADD of the other
    for m in (forgotten, expired):
        assert await mem.get(m.id, include_forgotten=True) is None
        assert await store.vectors.by_source(m.id) == []
    assert await mem.get(disputed.id, include_forgotten=True) is not None
    assert [e.event for e in await mem.history(live.id)] == ["ADD", "UPDATE"]
    assert len(await mem.accesses(live.id)) == 1
    assert await mem.get(recent.id, include_forgotten=True) is not None
    assert {h.source_id for h in await store.vectors.search([1.0, 0.5], k=10)} == {disputed.id, live.id}


async def test_vectors_of_a_source_gone_past_the_grace_period_are_purged(store: statekeel.Store) -> None:
    old = await store.memory.put("user", "k", "v1")
    new = await store.memory.put("user", "k2", "v2")
    await store.memory.supersede(old.id, new.id, reason="newer", actor="u")
    for m in (old, new):
        await store.vectors.upsert(f"v-{m.id}", m.id, [1.0, 2.0], model="m", source_version=m.version)
    await store.vectors.upsert("doc-a", "doc", [2.0, 1.0], model="m")
    await store.vectors.upsert("doc-b", "doc", [2.0, 1.5], model="m")
    await store.vectors.source_deleted("doc")
    await store.vectors.lagging()  # the index reads the memories' changes: the superseded one is gone
    cutoff = await moment()
    report = await purge_checked(store, only(memories=HOUR), cutoff + HOUR)
    assert (report.vectors, report.memories) == (3, 0)  # a superseded memory itself stays
    assert await store.memory.get(old.id) is not None
    assert [h.source_id for h in await store.vectors.search([1.0, 2.0], k=5)] == [new.id]


async def test_audit_entries_and_approvals_are_never_purged(store: statekeel.Store) -> None:
    await store.audit.append("tool_call", "agent", "task-1", {"n": 1})
    pending = await store.approvals.request("deploy", "push", {"b": "main"}, "agent")
    decided = await store.approvals.request("deploy", "push", {"b": "dev"}, "agent")
    await store.approvals.decide(decided.id, False, "alice", reason="no")
    before = await table_counts(store)
    report = await purge_checked(
        store, statekeel.Retention(traces=0, tasks=0, sessions=0, memories=0), dt.datetime.now(dt.UTC) + HOUR
    )
    assert report.total == 0
    assert await table_counts(store) == before
    assert (await store.audit.verify()).ok
    assert [a.id for a in await store.approvals.pending()] == [pending.id]


async def test_the_file_ledger_follows_its_task_but_keeps_each_paths_last_record(
    store: statekeel.Store,
) -> None:
    gone = await store.tasks.create("gone")
    kept = await store.tasks.create("kept")
    files = store.files
    await files.record("a.txt", "0" * 64, 1, task_id=gone.id)
    await files.record("a.txt", "1" * 64, 2, task_id=gone.id)
    await files.record("b.txt", "2" * 64, 3, task_id=gone.id)
    await files.record("b.txt", "3" * 64, 4, task_id=kept.id)
    await files.record("c.txt", "4" * 64, 5, task_id=kept.id)
    await files.record("c.txt", "5" * 64, 6, task_id=gone.id)  # the last record of c.txt: kept
    await store.tasks.transition(gone.id, "cancelled")
    cutoff = await moment()
    report = await purge_checked(store, only(tasks=HOUR), cutoff + HOUR)
    assert (report.tasks, report.file_changes) == (1, 2)
    left = [(r.path, r.seq, r.task_id) for r in await files.list()]
    assert sorted(left) == [
        ("a.txt", 2, gone.id),
        ("b.txt", 2, kept.id),
        ("c.txt", 1, kept.id),
        ("c.txt", 2, gone.id),
    ]


async def test_purge_gives_the_space_back_on_a_new_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "space.db"
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        for n in range(4000):
            store.traces.record(
                "t", {"span_id": f"{n:05d}", "name": "x", "started_at": T0, "attributes": {"text": "x" * 500}}
            )
        await store.traces.flush()
        await store.backend.shrink_log()
        full = path.stat().st_size
        report = await store.purge(T0 + dt.timedelta(days=31))
        assert report.traces == 4000 and report.reclaimed_pages > 400 and report.free_pages == 0
    assert path.stat().st_size < full / 3
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA auto_vacuum").fetchone() == (2,)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()


async def test_an_older_sqlite_file_reports_its_free_pages_until_vacuum(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)  # created before incremental auto-vacuum: mode none
    conn.execute("PRAGMA auto_vacuum = NONE")
    conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                 "checksum TEXT NOT NULL, applied_at INTEGER NOT NULL)")  # fmt: skip
    conn.close()
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        for n in range(2000):
            store.traces.record(
                "t", {"span_id": f"{n:05d}", "name": "x", "started_at": T0, "attributes": {"text": "x" * 500}}
            )
        await store.traces.flush()
        report = await store.purge(T0 + dt.timedelta(days=31))
        assert report.traces == 2000 and report.reclaimed_pages == 0 and (report.free_pages or 0) > 200
        assert await store.vacuum() == 0
        assert (await store.purge(T0 + dt.timedelta(days=31))).free_pages == 0
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA auto_vacuum").fetchone() == (2,)
    conn.close()


# --- whatever the mix, a protected row stays ---------------------------------------------------------------

STATUS_PATHS = {
    "pending": [],
    "queued": ["queued"],
    "running": ["running"],
    "suspended": ["running", "suspended"],
    "interrupted": ["running", "interrupted"],
    "success": ["running", "success"],
    "failed": ["running", "failed"],
    "cancelled": ["cancelled"],
}
UNFINISHED = {"pending", "queued", "running", "suspended", "interrupted"}

task_spec = st.tuples(st.sampled_from(sorted(STATUS_PATHS)), st.none() | st.integers(0, 4))
memory_spec = st.tuples(
    st.sampled_from(["live", "updated", "forgotten", "expired", "superseded"]), st.booleans()
)
mix = st.fixed_dictionaries(
    {
        "tasks": st.lists(task_spec, max_size=10),
        "workflows": st.lists(st.sampled_from(["cancelled", "started", "pending"]), max_size=3),
        "sessions": st.lists(st.sampled_from(["active", "expired", "archived"]), max_size=4),
        "memories": st.lists(memory_spec, max_size=8),
        "contradictions": st.lists(
            st.tuples(st.integers(0, 7), st.integers(0, 7), st.booleans()), max_size=3
        ),
        "approvals": st.lists(st.booleans(), max_size=2),
        "batch_size": st.integers(1, 4),
        "aged": st.booleans(),
    }
)


async def _build(store: statekeel.Store, spec: dict[str, Any]) -> dict[str, Any]:
    """Create the mix; return what must survive any purge."""
    keep: dict[str, Any] = {"tasks": set(), "sessions": {}, "memories": {}}
    tasks: list[Any] = []
    for status, parent in spec["tasks"]:
        parent_id = tasks[parent].id if parent is not None and parent < len(tasks) else None
        task = await store.tasks.create(status, parent_task_id=parent_id)
        for step in STATUS_PATHS[status]:
            await store.tasks.transition(task.id, step)
        await store.files.record(f"f{len(tasks) % 3}.txt", "a" * 64, 1, task_id=task.id)
        tasks.append(task)
        if status in UNFINISHED:
            # The task, and every ancestor (deleting one would cut the child's link).
            t: Any = task
            while t is not None:
                keep["tasks"].add(t.id)
                t = await store.tasks.get(t.parent_task_id) if t.parent_task_id else None
    for how in spec["workflows"]:
        wf = await store.workflows.create("wf", [{"name": "a"}, {"name": "b", "depends_on": ["a"]}])
        if how == "cancelled":
            await store.workflows.cancel(wf.id)
        else:
            if how == "started":
                await store.workflows.start(wf.id)
            keep["tasks"].update(step.task.id for step in wf.steps)
    for i, status in enumerate(spec["sessions"]):
        key = f"s{i}"
        s = await store.sessions.get_or_create(key)
        s.add_message("user", "hi")
        await store.sessions.save(s)
        if status == "expired":
            await store.sessions.expire(key)
        elif status == "archived":
            await store.sessions.archive(key)
        if status != "archived":
            keep["sessions"][key] = 1
    memories: list[Any] = []
    anchor = await store.memory.put("user", "anchor", "what superseded memories point at")
    keep["memories"][anchor.id] = 1
    for i, (state, vector) in enumerate(spec["memories"]):
        expires = dt.datetime.now(dt.UTC) if state == "expired" else None
        m = await store.memory.put("user", f"k{i}", "v", expires_at=expires)
        if state == "updated":
            m = await store.memory.put("user", f"k{i}", "v2")
        elif state == "forgotten":
            await store.memory.forget(m.id, reason="r", actor="a")
        elif state == "superseded":
            await store.memory.supersede(m.id, anchor.id, reason="r", actor="a")
        if vector:
            await store.vectors.upsert(f"v{i}", m.id, [1.0, float(i)], model="m", source_version=m.version)
        memories.append(m)
        if state in ("live", "updated", "superseded"):
            keep["memories"][m.id] = len(await store.memory.history(m.id))
    for a, b, resolved in spec["contradictions"]:
        if a < len(memories) and b < len(memories) and a != b:
            c = await store.memory.record_contradiction(memories[a].id, memories[b].id, "x")
            if resolved:
                await store.memory.resolve_contradiction(c.id, "settled")
            else:
                for m in (memories[a], memories[b]):
                    keep["memories"][m.id] = len(await store.memory.history(m.id))
    for memory_id in list(keep["memories"]):  # events written since (a supersede) count too
        keep["memories"][memory_id] = len(await store.memory.history(memory_id))
    for decided in spec["approvals"]:
        ap = await store.approvals.request("subj", "act", {"n": 1}, "agent")
        if decided:
            await store.approvals.decide(ap.id, True, "alice")
    await store.audit.append("note", "agent", "subj", {"n": 1})
    store.traces.record("t", {"span_id": "s", "name": "x", "started_at": T0})
    await store.traces.flush()
    await store.vectors.lagging()  # the index reads the memories' changes (gone sources)
    keep["audit"] = await store.backend.count_rows("audit_log")
    keep["approvals"] = await store.backend.count_rows("approvals")
    keep["files"] = {(r.path, r.seq) for r in await store.files.list() if r.task_id in keep["tasks"]}
    return keep


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(spec=mix)
def test_purge_never_removes_a_protected_row_whatever_the_mix(spec: dict[str, Any]) -> None:
    async def run() -> None:
        async with statekeel.open_store("memory://") as store:
            keep = await _build(store, spec)
            now = dt.datetime.now(dt.UTC) + (2 * HOUR if spec["aged"] else dt.timedelta(0))
            everything = statekeel.Retention(
                traces=HOUR, tasks=HOUR, sessions=HOUR, memories=HOUR, batch_size=spec["batch_size"]
            )
            await purge_checked(store, everything, now)
            for task_id in keep["tasks"]:
                assert await store.tasks.get(task_id) is not None, "a protected task was purged"
            for key, n in keep["sessions"].items():
                assert len(await store.backend.read_messages(key)) == n
            for memory_id, events in keep["memories"].items():
                assert await store.memory.get(memory_id, include_forgotten=True) is not None
                assert len(await store.memory.history(memory_id)) == events
            assert await store.backend.count_rows("audit_log") == keep["audit"]
            assert await store.backend.count_rows("approvals") == keep["approvals"]
            assert (await store.audit.verify()).ok
            assert keep["files"] <= {(r.path, r.seq) for r in await store.files.list()}

    asyncio.run(run())


async def test_purge_reports_each_batch_to_on_batch(store: statekeel.Store) -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for i in range(5):
        store.traces.record("old", {"span_id": f"s{i}", "name": "step", "started_at": t0, "ended_at": t0})
    await store.traces.flush()
    seen: list[dict[str, int]] = []
    retention = statekeel.Retention(
        traces=dt.timedelta(days=1), tasks=None, sessions=None, memories=None, batch_size=2
    )
    report = await purge(store, retention, t0 + dt.timedelta(days=2), False, seen.append)
    assert report.traces == 5
    assert [c["traces"] for c in seen] == [2, 4, 5, 5][: len(seen)] and seen[-1]["traces"] == 5
    assert report.batches == len(seen)
    with pytest.raises(statekeel.InvalidArgument):
        await store.purge(on_batch="print")  # type: ignore[arg-type]


# --- A purge deletes only what still matches its reason (invariant 13), with another writer forced in
# between the purge's read of a row and its delete. On PostgreSQL that writer commits before the purge
# locks the row, or waits for the lock the purge took with its check; on SQLite the writer thread holds
# the write lock for the whole batch, so no other connection can write in between at all.


async def _interleave(monkeypatch: pytest.MonkeyPatch, url: str, after: str, write: Any) -> dict[str, Any]:
    """Patch PostgreSQL's Tx so that, the first time the query named ``after`` has run, ``write()`` starts
    on another connection and the purge goes on once it finished or waits for a lock. Returns a dict that
    holds, once the purge is over, ``result`` (what ``write()`` returned, i.e. acknowledged) or ``error``."""
    import asyncpg

    from statekeel.backends.postgres.backend import PgTx

    outcome: dict[str, Any] = {}
    fetchone, fetchall = PgTx.fetchone, PgTx.fetchall

    async def run_write() -> None:
        try:
            outcome["result"] = await write()
        except statekeel.StatekeelError as exc:
            outcome["error"] = exc

    async def hook(name: str) -> None:
        if name != after or "task" in outcome:
            return
        outcome["task"] = task = asyncio.create_task(run_write())
        watcher = await asyncpg.connect(url)
        try:
            async with asyncio.timeout(10):  # until it is done, or waits for a row the purge locked
                while not task.done() and not await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                ):
                    await asyncio.sleep(0.01)
        finally:
            await watcher.close()

    async def one(self: PgTx, name: str, *args: Any) -> Any:
        row = await fetchone(self, name, *args)
        await hook(name)
        return row

    async def many(self: PgTx, name: str, *args: Any) -> Any:
        rows = await fetchall(self, name, *args)
        await hook(name)
        return rows

    monkeypatch.setattr(PgTx, "fetchone", one)
    monkeypatch.setattr(PgTx, "fetchall", many)
    return outcome


async def _settle(outcome: dict[str, Any]) -> None:
    assert "task" in outcome, "the purge never ran the query the test waits after"
    await outcome["task"]


@pytest.mark.postgres
@pytest.mark.parametrize("after", ["purge_memories_expired", "purge_memory_events_count"])
async def test_a_memory_put_again_while_the_purge_reads_it_survives(
    pg_migrated: str, monkeypatch: pytest.MonkeyPatch, after: str
) -> None:
    async with statekeel.open_store(pg_migrated) as store:
        old = await store.memory.put("user", "k", "old", expires_at=dt.datetime.now(dt.UTC))
        cutoff = await moment()
        outcome = await _interleave(
            monkeypatch, pg_migrated, after, lambda: store.memory.put("user", "k", "revived")
        )
        report = await purge(store, only(memories=HOUR), cutoff + HOUR, False)
        monkeypatch.undo()
        await _settle(outcome)
        acked = outcome["result"]  # a put is never refused here: it updates the row, or adds a new one
        kept = await store.memory.get(acked.id)
        assert kept is not None and kept.content == "revived" and kept.expires_at is None
        gone = await store.memory.get(old.id) is None
        assert report.memories == (1 if gone else 0)  # the report counts what went, nothing else


@pytest.mark.postgres
async def test_a_session_reopened_while_the_purge_reads_it_keeps_its_file_records(
    pg_migrated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with statekeel.open_store(pg_migrated) as store:
        session = await store.sessions.get_or_create("s")
        session.add_message("user", "hi")
        await store.sessions.save(session)
        await store.files.record("a.txt", "0" * 64, 1, session_key="s")
        await store.files.record("a.txt", "1" * 64, 2, session_key="s")
        await store.sessions.archive("s")
        cutoff = await moment()
        outcome = await _interleave(
            monkeypatch, pg_migrated, "purge_session_messages_count", lambda: store.sessions.reopen("s")
        )
        report = await purge(store, only(sessions=HOUR), cutoff + HOUR, False)
        monkeypatch.undo()
        await _settle(outcome)
        records = await store.files.list(session_key="s")
        if "result" in outcome:  # the reopen was acknowledged: the session and its whole ledger stay
            record = await store.backend.load_session("s")
            assert record is not None and record.status == "active"
            assert [r.seq for r in records] == [1, 2]
            assert (report.sessions, report.file_changes) == (0, 0)
        else:  # the purge went first: the reopen found nothing, and the report says what went
            assert await store.backend.load_session("s") is None
            assert [r.seq for r in records] == [2]
            assert (report.sessions, report.messages, report.file_changes) == (1, 1, 1)


@pytest.mark.postgres
@pytest.mark.parametrize("after", ["purge_tasks_candidates", "purge_task_steps_count"])
async def test_a_task_retried_while_the_purge_reads_it_keeps_its_steps_and_file_records(
    pg_migrated: str, monkeypatch: pytest.MonkeyPatch, after: str
) -> None:
    async with statekeel.open_store(pg_migrated) as store:
        task = await store.tasks.create("t")
        await store.tasks.transition(task.id, "running")
        await store.tasks.step(task.id, "fetch", lambda: 1)
        await store.files.record("a.txt", "0" * 64, 1, task_id=task.id)
        await store.files.record("a.txt", "1" * 64, 2, task_id=task.id)
        await store.tasks.transition(task.id, "failed")
        cutoff = await moment()
        outcome = await _interleave(
            monkeypatch, pg_migrated, after, lambda: store.tasks.transition(task.id, "queued")
        )
        report = await purge(store, only(tasks=HOUR), cutoff + HOUR, False)
        monkeypatch.undo()
        await _settle(outcome)
        records = await store.files.list(task_id=task.id)
        if "result" in outcome:  # the retry was acknowledged: the task, its steps and its ledger stay
            kept = await store.tasks.get(task.id)
            assert kept is not None and kept.status == "queued"
            assert len(await store.backend.list_steps(task.id)) == 1
            assert [r.seq for r in records] == [1, 2]
            assert (report.tasks, report.steps, report.file_changes) == (0, 0, 0)
        else:
            assert await store.tasks.get(task.id) is None
            assert [r.seq for r in records] == [2]
            assert (report.tasks, report.steps, report.file_changes) == (1, 1, 1)


@pytest.mark.postgres
async def test_a_child_given_to_a_workflows_task_while_the_purge_checks_it_keeps_its_parent(
    pg_migrated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with statekeel.open_store(pg_migrated) as store:
        wf = await store.workflows.create("w", [{"name": "a"}])
        await store.workflows.cancel(wf.id)
        parent_id = wf.steps[0].task.id
        cutoff = await moment()
        outcome = await _interleave(
            monkeypatch,
            pg_migrated,
            "purge_workflow_steps_count",
            lambda: store.tasks.create("child", parent_task_id=parent_id),
        )
        report = await purge(store, only(tasks=HOUR), cutoff + HOUR, False)
        monkeypatch.undo()
        await _settle(outcome)
        if "result" in outcome:  # the child was acknowledged: its parent, and so the workflow, stay
            child = await store.tasks.get(outcome["result"].id)
            assert child is not None and child.parent_task_id == parent_id
            assert await store.tasks.get(parent_id) is not None
            assert (report.workflows, report.tasks) == (0, 0)
        else:
            assert await store.workflows.get(wf.id) is None
            assert (report.workflows, report.tasks) == (1, 1)


@pytest.mark.postgres
async def test_a_vector_source_announced_again_while_the_purge_reads_it_keeps_its_vector_and_lags(
    pg_migrated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with statekeel.open_store(pg_migrated) as store:
        vectors = store.vectors
        await vectors.upsert("doc-v1", "doc", [1.0, 0.5], model="m", source_version=1)
        await vectors.source_deleted("doc")
        cutoff = await moment()

        async def announce_again() -> None:
            await vectors.source_changed("doc", 3)
            await vectors.upsert("doc-v2", "doc", [0.5, 1.0], model="m", source_version=2)

        outcome = await _interleave(monkeypatch, pg_migrated, "purge_vector_sources_gone", announce_again)
        report = await purge(store, only(memories=HOUR), cutoff + HOUR, False)
        monkeypatch.undo()
        await _settle(outcome)
        assert "result" in outcome
        assert {v.vec_id for v in await vectors.by_source("doc")} == {"doc-v1", "doc-v2"}
        assert [(lag.source_id, lag.version, lag.indexed_version) for lag in await vectors.lagging()] == [
            ("doc", 3, 2)
        ]
        assert report.vectors == 0
        assert {h.vec_id for h in await vectors.search([0.5, 1.0], k=5)} == {"doc-v1", "doc-v2"}


async def test_no_other_sqlite_writer_gets_between_a_purge_read_and_its_delete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite: the batch that lists a candidate holds the write lock until it deleted it, so another
    connection's write (a put reviving the memory) cannot land in between: it waits, and then finds the
    memory gone."""
    from statekeel.backends.sqlite.backend import SqliteTx

    path = tmp_path / "s.db"
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        old = await store.memory.put("user", "k", "old", expires_at=dt.datetime.now(dt.UTC))
        cutoff = await moment()
        tried: list[str] = []
        fetchall = SqliteTx.fetchall

        async def many(self: SqliteTx, name: str, *args: Any) -> Any:
            rows = await fetchall(self, name, *args)
            if name == "purge_memories_expired" and not tried:
                other = sqlite3.connect(path, timeout=0)
                try:
                    other.execute("UPDATE memories SET expires_at = NULL WHERE id = ?", (old.id,))
                    tried.append("written")
                except sqlite3.OperationalError as exc:
                    tried.append(str(exc))
                finally:
                    other.close()
            return rows

        monkeypatch.setattr(SqliteTx, "fetchall", many)
        report = await purge(store, only(memories=HOUR), cutoff + HOUR, False)
        monkeypatch.undo()
        assert tried == ["database is locked"]
        assert report.memories == 1 and await store.memory.get(old.id) is None
