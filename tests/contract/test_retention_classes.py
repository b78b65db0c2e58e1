"""docs/retention.md's table of retention classes is behaviour: every kind the store holds has one line,
and what the line says purge, erase and rebuild do to it is what they do."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest

import statekeel

DOC = Path(__file__).parent.parent.parent / "docs" / "retention.md"
SUBJECT = "user:alice"
OLD = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)


def table() -> dict[str, dict[str, str]]:
    text = DOC.read_text()
    section = text.split("## Retention classes", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, dict[str, str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] in ("kind", "") or set(cells[0]) <= {"-"}:
            continue
        assert cells[0] not in rows, f"{cells[0]} has two lines"
        rows[cells[0]] = dict(zip(("class", "purge", "erase", "rebuild"), cells[1:], strict=True))
    return rows


async def counts(store: statekeel.Store) -> dict[str, int]:
    return {t.name: await store.backend.count_rows(t.name) for t in await store.backend.copy_tables()}


async def put_rows(store: statekeel.Store, table_name: str, /, **values: Any) -> None:
    """One row of a table through the verbatim row access: ``values`` and plain defaults."""
    info = next(t for t in await store.backend.copy_tables() if t.name == table_name)
    defaults = {"text": "x", "int": 1, "float": 0.5, "json": "{}", "ts": OLD, "bool": False, "bytes": b"x"}
    row = tuple(values.get(column, defaults[kind]) for column, kind in info.columns)
    await store.backend.import_rows(table_name, [row])


def test_every_kind_of_the_store_has_one_line_with_known_words() -> None:
    from statekeel.backends.sql.copy import TABLES

    rows = table()
    assert set(rows) == {t.name for t in TABLES}
    for kind, row in rows.items():
        assert row["purge"] in ("by age", "with its parent", "never"), kind
        assert row["erase"] in ("erased", "kept"), kind
        assert row["rebuild"] in ("rebuilt", "—"), kind
        classes = {c.strip().split(" ")[0] for c in row["class"].split(",")}
        assert classes <= {"kept", "purged", "follows", "erasable", "rebuildable"}, kind
        assert ("kept" in classes) == (
            row["purge"] == "never" and row["erase"] == "kept" and not (classes - {"kept"})
        ), kind
        assert ("purged" in classes) == (row["purge"] == "by age"), kind
        assert ("follows" in classes) == (row["purge"] == "with its parent"), kind
        assert ("erasable" in classes) == (row["erase"] == "erased"), kind
        if row["rebuild"] == "rebuilt":
            assert "rebuildable" in classes, kind


async def _everything_of(store: statekeel.Store) -> None:
    """A row in every erasable kind that is the subject's, and a row of every kind that is not."""
    for key, meta in ((SUBJECT, {}), ("chat-1", {"subject": SUBJECT}), ("chat-2", {})):
        session = await store.sessions.get_or_create(key)
        session.metadata.update(meta)
        for i in range(4):
            session.add_message("user", f"{key} {i}")
        await store.sessions.save(session)
        await store.sessions.compress(key, 2, "summary")
        await store.sessions.rewind(key, 3, reason="undo the last turn")  # a rewound_messages row
        await put_rows(store, "session_steps", session_key=key, call_id="c1", status="succeeded",
                       error=None, result_seq=None)  # fmt: skip
        await store.files.record(f"{key}.txt", "ab" * 32, 1, session_key=key)
        await store.memory.add_episode(key, "episode")
        await store.vectors.source_changed(key, 1)  # a source named after the session
        await put_rows(store, "checkpoints", thread_id=key, parent_checkpoint_id=None, run_id=None)
        await put_rows(store, "checkpoint_blobs", thread_id=key)
        await put_rows(store, "checkpoint_writes", thread_id=key)
        now = dt.datetime.now(dt.UTC)
        store.traces.record(key, {"span_id": "s", "name": "n", "kind": "llm", "status": "ok",
                                  "started_at": now, "attributes": {}})  # fmt: skip
    for scope in (SUBJECT, "bob"):
        a = await store.memory.put("user", "name", f"{scope} a", scope=scope)
        b = await store.memory.put("user", "city", f"{scope} b", scope=scope)
        await store.memory.record_contradiction(a.id, b.id, "odd")
        store.memory.record_access(a.id)
        await store.vectors.upsert(f"v-{scope}", a.id, [1.0, 0.0], model="tiny")
        await store.memory.relate(scope, "knows", "carol")
    await store.memory.flush()
    await store.traces.flush()
    task = await store.tasks.create("t")
    await store.tasks.step(task.id, "s", lambda: 1)
    await store.workflows.create("wf", [{"name": "a"}])
    approval = await store.approvals.request("x", "rm", {}, "agent")
    await store.approvals.decide(approval.id, True, "human")
    await put_rows(store, "trace_counters", name="dropped")
    await put_rows(store, "vector_cursors", name="rebuild", id="x")


async def test_erase_deletes_the_kinds_the_table_calls_erased_and_no_other(store: statekeel.Store) -> None:
    rows = table()
    await _everything_of(store)
    before = await counts(store)
    assert [kind for kind in rows if rows[kind]["erase"] == "erased" and not before[kind]] == []
    await store.erase(SUBJECT, actor="dpo", reason="the table")
    after = await counts(store)
    for kind, row in rows.items():
        if row["erase"] == "erased":
            assert after[kind] < before[kind], kind
            assert after[kind] > 0 or kind == "vector_models", kind  # someone else's rows stay
        elif kind == "audit_log":
            assert after[kind] == before[kind] + 1  # the erasure's own entry, nothing removed
        else:
            assert after[kind] == before[kind], kind


async def _purgeable(store: statekeel.Store) -> None:
    """Rows old enough to purge of every kind purge deletes, and rows it never deletes."""
    await _everything_of(store)
    session = await store.sessions.load("chat-2")
    assert session is not None
    await store.sessions.archive("chat-2")
    await store.vectors.source_deleted("chat-2")
    for memory in (await store.memory.query(scope="bob")).items:
        await store.memory.forget(memory.id, reason="old", actor="t")
    for contradiction in await store.memory.open_contradictions():
        await store.memory.resolve_contradiction(contradiction.id, "resolved")
    workflow = (await store.workflows.list())[0]
    await store.workflows.start(workflow.id)
    for task in (await store.tasks.list()).items:
        await store.tasks.transition(task.id, "cancelled")
    parent = await store.tasks.create("with files")
    await store.files.record("done.txt", "ab" * 32, 1, task_id=parent.id)
    await store.files.record("done.txt", "cd" * 32, 1, task_id=parent.id)
    await store.tasks.transition(parent.id, "cancelled")
    await store.workflows.advance(workflow.id)


async def test_purge_deletes_the_kinds_the_table_says_and_never_the_others(store: statekeel.Store) -> None:
    rows = table()
    await _purgeable(store)
    before = await counts(store)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    retention = statekeel.Retention(traces=0, tasks=0, sessions=0, memories=0)
    report = await statekeel.retention.purge(store, retention, later, False)
    assert report.total
    after = await counts(store)
    for kind, row in rows.items():
        if row["purge"] == "never":
            assert after[kind] == before[kind], kind
        else:
            assert after[kind] < before[kind], kind


async def test_rebuild_makes_again_what_the_table_calls_rebuilt(store: statekeel.Store) -> None:
    rows = table()
    assert [k for k, r in rows.items() if r["rebuild"] == "rebuilt"] == ["vectors"]
    memory = await store.memory.put("user", "name", "Alice", scope=SUBJECT)
    await store.vectors.rebuild(lambda texts: [[1.0, float(len(t))] for t in texts], model="tiny")
    assert [v.source_id for v in await store.vectors.by_source(memory.id)] == [memory.id]
    for vector in await store.vectors.by_source(memory.id):
        await store.vectors.delete(vector.vec_id)
    assert await store.vectors.by_source(memory.id) == []
    await store.vectors.source_changed(memory.id, memory.version + 1)
    await store.vectors.rebuild(lambda texts: [[1.0, float(len(t))] for t in texts], model="tiny")
    assert [v.source_id for v in await store.vectors.by_source(memory.id)] == [memory.id]


@pytest.mark.parametrize("kind", sorted(table()))
def test_each_line_names_a_kind_the_store_exports(kind: str) -> None:
    from statekeel.export import KIND_GROUPS

    assert any(kind in tables for tables in KIND_GROUPS.values())
    assert re.fullmatch(r"[a-z_]+", kind)
