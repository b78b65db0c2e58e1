"""export_store / import_store: one self-describing JSONL file that moves every kind between backends
record for record, and that an import refuses before writing anything when it is damaged."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import orjson
import pytest

import statekeel
from statekeel.export import FORMAT, FORMAT_VERSION


async def fill(store: statekeel.Store) -> None:
    """At least one row of most kinds, with parents, links and an audit chain."""
    for key, meta in (("alice", {"subject": "u1"}), ("bob", {})):
        session = await store.sessions.get_or_create(key)
        session.metadata.update(meta)
        for i in range(12):
            session.add_message("user" if i % 2 == 0 else "assistant", f"{key} turn {i} ü ünïcode")
        await store.sessions.save(session)
    await store.sessions.compress("alice", 4, "alice's first turns")
    parent = await store.tasks.create("parent", metadata={"n": 1})
    child = await store.tasks.create("child", parent_task_id=parent.id)
    await store.tasks.step(child.id, "fetch", lambda: {"rows": 3})
    await store.workflows.create("wf", [{"name": "a"}, {"name": "b", "depends_on": ["a"]}])
    await store.audit.append("note", "tester", "case:1", {"a": [1, 2.5, None]})
    approval = await store.approvals.request("task:1", "rm", {"path": "x"}, "agent")
    await store.approvals.decide(approval.id, True, "human", reason="fine")
    m1 = await store.memory.put("user", "name", "Alice", scope="u1", data={"w": 0.25})
    m2 = await store.memory.put("semantic", "tz", "UTC+1", scope="u1", confidence=0.5)
    await store.memory.record_contradiction(m1.id, m2.id, "odd")
    await store.memory.relate("u1", "likes", "tea", source_memory_id=m1.id)
    await store.memory.add_episode("alice", "talked about tea", first_seq=0, upto_seq=3)
    await store.files.record("src/a.py", "ab" * 32, 10, session_key="alice")
    span = {"span_id": "s1", "name": "llm", "kind": "llm", "status": "ok", "attributes": {"model": "m"}}
    store.traces.record("alice", {**span, "started_at": dt.datetime.now(dt.UTC)})
    await store.traces.flush()
    await store.vectors.upsert("v1", m1.id, [0.5, 0.25, 1.0], model="tiny", metadata={"k": "v"})


def body(path: Path) -> list[dict[str, Any]]:
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    return [orjson.loads(line) for line in lines[1:-1]]


def header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        parsed: dict[str, Any] = orjson.loads(fh.readline())
        return parsed


async def row_counts(store: statekeel.Store) -> dict[str, int]:
    return {t.name: await store.backend.count_rows(t.name) for t in await store.backend.copy_tables()}


@pytest.mark.postgres
async def test_round_trip_sqlite_to_postgresql_to_sqlite_is_equal_record_by_record(
    tmp_path: Path, pg_migrated: str
) -> None:
    first, second, third = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'src.db'}") as src:
        await fill(src)
        exported = await statekeel.export_store(src, first)
    async with statekeel.open_store(pg_migrated) as pg:
        imported = await statekeel.import_store(pg, first)
        assert imported.counts == exported.counts and imported.sha256 == exported.sha256
        assert (await pg.audit.verify()).ok
        await statekeel.export_store(pg, second)
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'dst.db'}") as dst:
        await statekeel.import_store(dst, second)
        assert (await dst.audit.verify()).ok
        await statekeel.export_store(dst, third)
        loaded = await dst.sessions.load("alice")
        assert loaded is not None and loaded.messages[-1]["content"] == "alice turn 11 ü ünïcode"
    records = body(first)
    assert len(records) == exported.records > 30
    assert body(second) == records
    assert body(third) == records
    assert {r["kind"] for r in records} >= {
        "sessions", "messages", "compressions", "message_archive", "tasks", "task_steps", "workflows",
        "workflow_steps", "audit_log", "approvals", "memories", "memory_events", "memory_contradictions",
        "memory_relations", "memory_episodes", "file_changes", "traces", "vector_models", "vectors",
    }  # fmt: skip


async def test_the_header_describes_the_body(store: statekeel.Store, tmp_path: Path) -> None:
    await fill(store)
    path = tmp_path / "x.jsonl"
    report = await statekeel.export_store(store, path)
    head = header(path)
    assert head["format"] == FORMAT and head["format_version"] == FORMAT_VERSION
    assert head["schema_version"] == await store.backend.schema_version()
    records = body(path)
    for kind, n in head["counts"].items():
        assert sum(1 for r in records if r["kind"] == kind) == n
    for record in records:
        assert list(record["row"]) == [c for c, _ in head["columns"][record["kind"]]]
    raw = path.read_bytes()

    assert hashlib.sha256(raw[raw.index(b"\n") + 1 :]).hexdigest() == head["body_sha256"] == report.sha256
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert report.bytes == len(raw)


async def test_an_export_of_some_sessions_holds_only_their_records(
    store: statekeel.Store, tmp_path: Path
) -> None:
    await fill(store)
    path = tmp_path / "alice.jsonl"
    report = await statekeel.export_store(store, path, sessions=["alice"])
    records = body(path)
    assert report.counts["sessions"] == 1 and report.counts["messages"] == 8
    assert report.counts["message_archive"] == 4 and report.counts["memory_episodes"] == 1
    assert report.counts["file_changes"] == 1
    for record in records:
        row = record["row"]
        assert row.get("session_key", row.get("key")) == "alice"
    assert "tasks" not in report.counts and "audit_log" not in report.counts


async def test_an_export_of_some_kinds_holds_only_those(store: statekeel.Store, tmp_path: Path) -> None:
    await fill(store)
    path = tmp_path / "memory.jsonl"
    report = await statekeel.export_store(store, path, kinds=["memory", "traces"])
    assert {r["kind"] for r in body(path)} <= {
        "memories", "memory_events", "memory_episodes", "memory_relations", "memory_contradictions",
        "memory_accesses", "traces", "trace_counters",
    }  # fmt: skip
    assert report.counts["memories"] == 2
    other = await statekeel.open_store("memory://")
    try:
        await statekeel.import_store(other, path)
        found = await other.memory.query(scope="u1")
        assert sorted(m.content for m in found.items) == ["Alice", "UTC+1"]
    finally:
        await other.close()


async def test_an_existing_export_path_is_refused_unless_overwrite(
    store: statekeel.Store, tmp_path: Path
) -> None:
    (tmp_path / "out").mkdir()
    path = tmp_path / "out" / "x.jsonl"
    path.write_bytes(b"keep me")
    with pytest.raises(statekeel.InvalidArgument, match="exists"):
        await statekeel.export_store(store, path)
    assert path.read_bytes() == b"keep me"
    await statekeel.export_store(store, path, overwrite=True)
    assert header(path)["format"] == FORMAT
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.jsonl"]  # no temporary file left


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sessions": "alice"}, "list of session keys"),
        ({"sessions": [""]}, "non-empty"),
        ({"sessions": []}, "empty"),
        ({"kinds": ["nope"]}, "unknown kind"),
        ({"kinds": "sessions"}, "list of kind names"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
async def test_bad_export_arguments_raise_before_a_file_is_written(
    store: statekeel.Store, tmp_path: Path, kwargs: dict[str, Any], match: str
) -> None:
    (tmp_path / "out").mkdir()
    with pytest.raises(statekeel.InvalidArgument, match=match):
        await statekeel.export_store(store, tmp_path / "out" / "x.jsonl", **kwargs)
    assert list((tmp_path / "out").iterdir()) == []


def _damage(path: Path, how: str) -> None:
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    if how == "last record dropped":
        path.write_bytes(b"\n".join(lines[:-2]) + b"\n")
    elif how == "cut mid-line":
        path.write_bytes(raw[: len(raw) - 40])
    elif how == "record edited":
        path.write_bytes(raw.replace(b"alice turn 3", b"alice turn 9", 1))
    elif how == "count edited":
        head = orjson.loads(lines[0])
        head["counts"]["messages"] += 1
        path.write_bytes(orjson.dumps(head) + b"\n" + b"\n".join(lines[1:]))
    elif how == "record added":
        path.write_bytes(raw + lines[2] + b"\n")
    elif how == "not an export":
        path.write_bytes(b'{"hello": 1}\n')
    elif how == "empty":
        path.write_bytes(b"")


@pytest.mark.parametrize(
    "how",
    ["last record dropped", "cut mid-line", "record edited", "count edited", "record added",
     "not an export", "empty"],
)  # fmt: skip
async def test_a_damaged_file_is_refused_with_nothing_written(
    store: statekeel.Store, tmp_path: Path, how: str
) -> None:
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'src.db'}") as src:
        await fill(src)
        await statekeel.export_store(src, tmp_path / "x.jsonl")
    _damage(tmp_path / "x.jsonl", how)
    with pytest.raises(statekeel.ExportCorrupt):
        await statekeel.import_store(store, tmp_path / "x.jsonl")
    assert not any((await row_counts(store)).values())


async def test_a_newer_format_or_schema_is_refused(store: statekeel.Store, tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    await statekeel.export_store(store, path)
    raw = path.read_bytes()
    end = raw.index(b"\n")
    for field, bump in (("format_version", FORMAT_VERSION + 1), ("schema_version", 10_000)):
        head = orjson.loads(raw[:end])
        head[field] = bump
        path.write_bytes(orjson.dumps(head) + raw[end:])
        with pytest.raises(statekeel.ExportTooNew):
            await statekeel.import_store(store, path)


async def test_a_record_whose_key_the_store_holds_fails_the_whole_import(
    store: statekeel.Store, tmp_path: Path
) -> None:
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'src.db'}") as src:
        await fill(src)
        await statekeel.export_store(src, tmp_path / "x.jsonl", kinds=["sessions", "memory"])
    session = await store.sessions.get_or_create("bob")
    session.add_message("user", "mine")
    await store.sessions.save(session)
    before = await row_counts(store)
    with pytest.raises(statekeel.ConflictError, match="nothing was imported"):
        await statekeel.import_store(store, tmp_path / "x.jsonl")
    assert await row_counts(store) == before
    assert await store.sessions.load("alice") is None


async def test_audit_entries_go_only_into_a_store_without_any(store: statekeel.Store, tmp_path: Path) -> None:
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'src.db'}") as src:
        await fill(src)
        await statekeel.export_store(src, tmp_path / "x.jsonl")
    await store.audit.append("mine", "me", "thing", {})
    # The refusal says why (the audit log holds entries), not the generic "its key is held already".
    with pytest.raises(
        statekeel.ConflictError, match="holds audit entries and this store's audit log has 1 already"
    ) as refused:
        await statekeel.import_store(store, tmp_path / "x.jsonl")
    assert refused.value.fields["rows"] == 1
    assert (await row_counts(store))["audit_log"] == 1
    assert (await row_counts(store))["sessions"] == 0


async def test_bad_import_arguments_raise(store: statekeel.Store, tmp_path: Path) -> None:
    with pytest.raises(statekeel.InvalidArgument, match="on_conflict"):
        await statekeel.import_store(store, tmp_path / "x.jsonl", on_conflict="merge")
    with pytest.raises(statekeel.InvalidArgument, match="not a file"):
        await statekeel.import_store(store, tmp_path / "missing.jsonl")


async def test_an_export_carries_forks_rewinds_and_usage(store: statekeel.Store, tmp_path: Path) -> None:
    s = await store.sessions.get_or_create("p")
    for i in range(4):
        s.add_message("assistant", f"m{i}", usage={"model": "m", "input_tokens": 1})
    await store.sessions.save(s)
    await store.sessions.fork("p", 3, new_key="f")
    rewind = await store.sessions.rewind("p", 2, reason="undo")  # f gets its own copy of m2
    path = tmp_path / "branches.jsonl"
    report = await statekeel.export_store(store, path)
    assert report.counts["rewound_messages"] == 2
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'dst.db'}") as dst:
        await statekeel.import_store(dst, path)
        f = await dst.sessions.load("f")
        assert f is not None and f.parent == ("p", 2)
        assert [m["content"] for m in f.messages] == ["m0", "m1", "m2"]
        archived = await dst.sessions.archived("p", rewind.compression_id)
        assert [a.payload["content"] for a in archived] == ["m2", "m3"]
        assert (await dst.sessions.usage("f")).input_tokens == 3
