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


OLD_EXPORTS = Path(__file__).parent.parent / "migration" / "fixtures" / "exports"
# What tests/migration/fixtures/exports/make_exports.py writes into every file.
OLD_MESSAGES = {"alice": [f"alice turn {i} ü" for i in range(6)], "bob": ["bob asks", "bob is answered"]}


def by_key(records: list[dict[str, Any]], kind: str, key: tuple[str, ...]) -> dict[Any, dict[str, Any]]:
    return {tuple(r["row"][k] for k in key): r["row"] for r in records if r["kind"] == kind}


@pytest.mark.parametrize("version", [12, 13, 14, 15, 16, 17, 18, 19])
async def test_an_export_of_every_older_schema_imports_filled_as_its_migrations_fill_it(
    store: statekeel.Store, tmp_path: Path, version: int
) -> None:
    fixture = OLD_EXPORTS / f"schema_{version}.jsonl"
    assert header(fixture)["schema_version"] == version
    report = await statekeel.import_store(store, fixture)
    assert report.counts == header(fixture)["counts"] and report.schema_version == version
    assert (await store.audit.verify()).ok

    # Record for record: every value of the file as it was, every column it lacks as its migration fills it.
    again = tmp_path / "again.jsonl"
    await statekeel.export_store(store, again)
    old, new = body(fixture), body(again)
    infos = {t.name: t for t in await store.backend.copy_tables()}
    for kind, columns in header(fixture)["columns"].items():
        key = infos[kind].key
        theirs, ours = by_key(old, kind, key), by_key(new, kind, key)
        assert set(theirs) == set(ours), kind
        for k, row in theirs.items():
            assert {c: ours[k][c] for c, _ in columns} == row, (kind, k)
    for row in by_key(new, "sessions", ("key",)).values():
        if version < 13:
            assert (row["parent_key"], row["parent_seq"], row["rewinds"]) == (None, None, 0)
    for row in by_key(new, "compressions", ("session_key", "compression_id")).values():
        assert row["kind"] in ("compression", "rewind")
        if version < 13:
            assert row["kind"] == "compression"

    alice = await store.sessions.load("alice", include_archived=True)
    assert alice is not None and alice.metadata == {"owner": "alice"}
    assert [m["content"] for m in alice.messages] == OLD_MESSAGES["alice"]
    assert [s.summary for s in alice.summaries] == ["alice said hello twice"]
    # The imported session goes on as one of this store's own: a save, then a rewind (which needs the
    # columns schema 13 added).
    alice.add_message("user", "after the import")
    await store.sessions.save(alice)
    await store.sessions.rewind("alice", 5, reason="undo")
    bob = await store.sessions.load("bob")
    assert bob is not None and [m["content"] for m in bob.messages] == OLD_MESSAGES["bob"]
    tasks = (await store.tasks.list()).items
    assert sorted(t.title for t in tasks) == ["a", "b", "child", "parent"]  # a, b: the workflow's
    child = next(t for t in tasks if t.title == "child")
    assert child.parent_task_id == next(t.id for t in tasks if t.title == "parent")
    assert [m.content for m in (await store.memory.query(scope="u1", key="name")).items] == ["Alice"]


async def test_an_older_export_lacking_a_column_its_schema_had_is_refused(
    store: statekeel.Store, tmp_path: Path
) -> None:
    raw = (OLD_EXPORTS / "schema_12.jsonl").read_bytes()
    end = raw.index(b"\n")
    head = orjson.loads(raw[:end])
    head["columns"]["sessions"] = [c for c in head["columns"]["sessions"] if c[0] != "write_id"]
    lines = [orjson.loads(line) for line in raw[end + 1 :].splitlines()]
    for record in lines:
        if record["kind"] == "sessions":
            del record["row"]["write_id"]
    out = b"".join(orjson.dumps(r) + b"\n" for r in lines)
    head["body_bytes"], head["body_sha256"] = len(out), hashlib.sha256(out).hexdigest()
    path = tmp_path / "x.jsonl"
    path.write_bytes(orjson.dumps(head) + b"\n" + out)
    with pytest.raises(statekeel.ExportCorrupt, match="lack the column write_id"):
        await statekeel.import_store(store, path)
    assert not any((await row_counts(store)).values())


async def test_a_refused_record_says_what_the_store_refused(store: statekeel.Store, tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'src.db'}") as src:
        session = await src.sessions.get_or_create("bob")
        session.add_message("user", "mine")
        await src.sessions.save(session)
        await statekeel.export_store(src, path, kinds=["sessions"])
    raw = path.read_bytes()
    end = raw.index(b"\n")
    head = orjson.loads(raw[:end])
    # Messages without their session: into an empty store, so no key can be held already.
    lines = [r for r in map(orjson.loads, raw[end + 1 :].splitlines()) if r["kind"] != "sessions"]
    out = b"".join(orjson.dumps(r) + b"\n" for r in lines)
    head["counts"]["sessions"] = 0
    head["body_bytes"], head["body_sha256"] = len(out), hashlib.sha256(out).hexdigest()
    path.write_bytes(orjson.dumps(head) + b"\n" + out)
    with pytest.raises(statekeel.ConflictError, match="nothing was imported") as caught:
        await statekeel.import_store(store, path)
    assert "held already" not in caught.value.message
    assert caught.value.hint == ""
    assert not any((await row_counts(store)).values())
