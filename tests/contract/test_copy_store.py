"""copy_store: every state kind moves between backends verbatim, resumably, and is verified row by row at the
end; a store is never copied onto itself, however its two URLs are spelled."""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest

import statekeel
from helpers import exists, message
from statekeel.audit import AuditLog
from statekeel.backends.base import NewTask, StorageBackend
from statekeel.backends.sql.copy import TABLES, table_spec


def _sqlite_url(tmp_path: Any, name: str = "src.db") -> str:
    return f"sqlite:///{os.path.join(os.fspath(tmp_path), name)}"


async def _populate(store: statekeel.Store, *, sessions: int = 7, turns: int = 5) -> None:
    """Some of every kind: sessions with messages and an archive, tasks (a child before its parent in
    key order), steps, a workflow, audit entries and approvals."""
    b = store.backend
    for i in range(sessions):
        key = f"sess-{i:03d}-é"
        meta = store.codec.encode({"owner": i, "at": dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)})
        head = 0
        for t in range(turns):
            msgs = [message(store, f"q{t}"), message(store, {"n": t, "big": 2**70}, "assistant")]
            rec = await b.append_messages(key, head, msgs, metadata=meta, create=True)
            head = rec.head_seq
        if i % 3 == 0:
            await b.archive_messages(
                key, compression_id=f"c-{i}", upto_seq=4, summary=f"summary {i}", expected_consolidated=0
            )
    # "a-child" sorts before "z-parent": the parent link must survive a forward reference.
    await b.create_task(NewTask(id="z-parent", title="parent"))
    await b.create_task(NewTask(id="a-child", title="child", parent_task_id="z-parent", idempotency_key="k1"))
    step, run = await b.begin_step("a-child", "fetch", rerun_started=False)
    assert run
    await b.finish_step("a-child", "fetch", status="succeeded", attempt=step.attempt, result=b'{"ok": true}')
    audit = AuditLog(b, store.codec)
    for n in range(5):
        await audit.append("tool_call", "agent-1", f"task-{n % 2}", {"n": n, "args": [1, 2.5, "x"]})
    now = dt.datetime.now(dt.UTC)
    # Through the manager: an approval is bound to its audit entry, which the copy must carry along.
    await store.approvals.request(
        "deploy", "push", {"branch": "main"}, "agent-1", expires_at=now + dt.timedelta(hours=1)
    )
    start = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
    store.traces.record("trace-é", {"span_id": "root", "name": "agent", "kind": "agent", "started_at": start})
    for n in range(6):
        store.traces.record(
            "trace-é",
            {
                "span_id": f"s{n}",
                "parent_span_id": "root",
                "name": "tool",
                "started_at": start + dt.timedelta(seconds=n),
                "ended_at": None if n == 5 else start + dt.timedelta(seconds=n + 1),
                "status": "error" if n == 2 else "ok",
                "attributes": {"n": n, "big": 2**70, "at": start},
            },
        )
    await store.traces.flush()
    await store.backend.write_spans([], dropped=3)  # spans a full buffer lost
    # Vectors with their model, a source announced ahead of its vector, and the index's memory cursor.
    memory = await store.memory.put("user", "drink", "tea")
    await store.vectors.upsert(
        "vec-é", memory.id, [0.5, -1.25, 3.0], model="mini", source_version=1, metadata={"big": 2**70}
    )
    await store.vectors.source_changed("doc-é", 2)
    await store.vectors.lagging()


async def _dump(backend: StorageBackend) -> dict[str, list[tuple[Any, ...]]]:
    """Every copyable table in key order, JSON compared by value (PostgreSQL JSONB reformats text)."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for info in await backend.copy_tables():
        spec = table_spec(info.name)
        rows: list[tuple[Any, ...]] = []
        after = None
        while True:
            page = await backend.export_rows(info.name, after=after, limit=3)
            if not page.rows:
                break
            for row in page.rows:
                rows.append(
                    tuple(
                        orjson.loads(v) if kind == "json" and v is not None else v
                        for (_, kind), v in zip(spec.columns, row, strict=True)
                    )
                )
            after = page.last_key
        out[info.name] = rows
    return out


async def _assert_same(src: statekeel.Store, dst: statekeel.Store) -> None:
    src_dump, dst_dump = await _dump(src.backend), await _dump(dst.backend)
    assert set(src_dump) == {t.name for t in TABLES}
    assert src_dump == dst_dump
    # What users depend on, through the contract: history, archive, chains.
    for i in range(7):
        key = f"sess-{i:03d}-é"
        assert await dst.backend.load_session_with_messages(
            key
        ) == await src.backend.load_session_with_messages(key)
        assert await dst.backend.read_archive(key) == await src.backend.read_archive(key)
    child = await dst.backend.get_task("a-child")
    assert child is not None and child.parent_task_id == "z-parent"
    verification = await AuditLog(dst.backend, dst.codec).verify()
    assert verification.ok and verification.count == 6 and verification.approvals == 1
    spans = await dst.backend.read_trace("trace-é")
    assert len(spans) == 7 and spans == await src.backend.read_trace("trace-é")
    assert await dst.backend.spans_dropped() == 3
    assert await dst.vectors.search([0.5, -1.25, 3.0]) == await src.vectors.search([0.5, -1.25, 3.0])
    assert [lag.source_id for lag in await dst.vectors.lagging()] == ["doc-é"]


@pytest.mark.postgres
async def test_copy_sqlite_to_postgres_copies_every_kind_verbatim(tmp_path: Any, pg_migrated: str) -> None:
    async with statekeel.open_store(_sqlite_url(tmp_path)) as src:
        await _populate(src)
    report = await statekeel.copy_store(_sqlite_url(tmp_path), pg_migrated, batch_size=4)
    assert report.verified
    assert {t.table: t.source_rows for t in report.tables}["messages"] == 7 * 10 - 3 * 4
    assert report.copied == sum(t.destination_rows for t in report.tables)
    async with statekeel.open_store(_sqlite_url(tmp_path)) as src, statekeel.open_store(pg_migrated) as dst:
        await _assert_same(src, dst)
        # The copy is a working store: appends continue at the copied head.
        rec = await dst.backend.append_messages("sess-001-é", 10, [message(dst, "after copy")])
        assert rec.head_seq == 11


@pytest.mark.postgres
async def test_copy_postgres_to_sqlite_copies_every_kind_verbatim(tmp_path: Any, pg_migrated: str) -> None:
    async with statekeel.open_store(pg_migrated) as src:
        await _populate(src)
    dst_url = _sqlite_url(tmp_path, "dst.db")
    report = await statekeel.copy_store(pg_migrated, dst_url, batch_size=5)
    assert report.verified and not report.resumed
    async with statekeel.open_store(pg_migrated) as src, statekeel.open_store(dst_url) as dst:
        await _assert_same(src, dst)


async def test_copy_sqlite_to_mariadb_copies_every_kind_verbatim(tmp_path: Any, my_migrated: str) -> None:
    async with statekeel.open_store(_sqlite_url(tmp_path)) as src:
        await _populate(src)
    report = await statekeel.copy_store(_sqlite_url(tmp_path), my_migrated, batch_size=4)
    assert report.verified
    assert report.copied == sum(t.destination_rows for t in report.tables)
    async with statekeel.open_store(_sqlite_url(tmp_path)) as src, statekeel.open_store(my_migrated) as dst:
        await _assert_same(src, dst)
        rec = await dst.backend.append_messages("sess-001-é", 10, [message(dst, "after copy")])
        assert rec.head_seq == 11


@pytest.mark.postgres
async def test_copy_mariadb_to_postgres_and_back_to_sqlite_copies_every_kind_verbatim(
    tmp_path: Any, my_migrated: str, pg_migrated: str
) -> None:
    async with statekeel.open_store(my_migrated) as src:
        await _populate(src)
    report = await statekeel.copy_store(my_migrated, pg_migrated, batch_size=5)
    assert report.verified and not report.resumed
    dst_url = _sqlite_url(tmp_path, "dst.db")
    assert (await statekeel.copy_store(pg_migrated, dst_url, batch_size=3)).verified
    async with statekeel.open_store(my_migrated) as src:
        async with statekeel.open_store(pg_migrated) as pg:
            await _assert_same(src, pg)
        async with statekeel.open_store(dst_url) as lite:
            await _assert_same(src, lite)


async def test_interrupted_copy_to_mariadb_resumes_where_it_stopped(tmp_path: Any, my_migrated: str) -> None:
    async with statekeel.open_store(_sqlite_url(tmp_path)) as src:
        await _populate(src)

    def crash_in_messages(table: str, copied: int) -> None:
        if table == "messages" and copied >= 12:
            raise _Interrupted

    with pytest.raises(_Interrupted):
        await statekeel.copy_store(
            _sqlite_url(tmp_path), my_migrated, batch_size=4, on_batch=crash_in_messages
        )
    async with statekeel.open_store(my_migrated) as dst:
        assert await dst.backend.count_rows("messages") == 12
    with pytest.raises(statekeel.ConflictError, match="resume=True"):
        await statekeel.copy_store(_sqlite_url(tmp_path), my_migrated)
    report = await statekeel.copy_store(_sqlite_url(tmp_path), my_migrated, batch_size=4, resume=True)
    assert report.verified and report.resumed
    assert {t.table: t for t in report.tables}["messages"].copied == 7 * 10 - 3 * 4 - 12
    async with statekeel.open_store(_sqlite_url(tmp_path)) as src, statekeel.open_store(my_migrated) as dst:
        await _assert_same(src, dst)


class _Interrupted(Exception):
    pass


@pytest.mark.postgres
async def test_interrupted_copy_resumes_where_it_stopped(tmp_path: Any, pg_migrated: str) -> None:
    async with statekeel.open_store(_sqlite_url(tmp_path)) as src:
        await _populate(src)
    batches: list[tuple[str, int]] = []

    def crash_in_messages(table: str, copied: int) -> None:
        batches.append((table, copied))
        if table == "messages" and copied >= 12:
            raise _Interrupted

    with pytest.raises(_Interrupted):
        await statekeel.copy_store(
            _sqlite_url(tmp_path), pg_migrated, batch_size=4, on_batch=crash_in_messages
        )
    async with statekeel.open_store(pg_migrated) as dst:
        assert await dst.backend.count_rows("sessions") == 7
        assert await dst.backend.count_rows("messages") == 12
        assert await dst.backend.count_rows("audit_log") == 0
    # Without resume=True the half-filled destination is refused, and left as it was.
    with pytest.raises(statekeel.ConflictError, match="resume=True"):
        await statekeel.copy_store(_sqlite_url(tmp_path), pg_migrated)
    report = await statekeel.copy_store(_sqlite_url(tmp_path), pg_migrated, batch_size=4, resume=True)
    assert report.resumed and report.verified
    by_table = {t.table: t for t in report.tables}
    assert by_table["sessions"].copied == 0  # finished before the crash: not copied again
    assert by_table["messages"].copied == 7 * 10 - 3 * 4 - 12
    assert by_table["messages"].resumed_after is not None
    async with statekeel.open_store(_sqlite_url(tmp_path)) as src, statekeel.open_store(pg_migrated) as dst:
        await _assert_same(src, dst)


# Verification compares rows, not only counts: a resumed copy continues after the last key the destination
# holds, so a row the source changed before that key (a finished task, an expired session) is never copied
# again while the counts still match.
async def test_resume_after_the_source_changed_a_copied_row_is_not_reported_verified(
    tmp_path: Path,
) -> None:
    src_url, dst_url = _sqlite_url(tmp_path), _sqlite_url(tmp_path, "dst.db")
    async with statekeel.open_store(src_url) as src:
        task = await src.tasks.create("deploy")
        for i in range(5):
            session = await src.sessions.get_or_create(f"s{i}")
            session.add_message("user", f"m{i}")
            await src.sessions.save(session)

    def stop_in_messages(table: str, copied: int) -> None:
        if table == "messages":
            raise _Interrupted

    with pytest.raises(_Interrupted):
        await statekeel.copy_store(src_url, dst_url, batch_size=2, on_batch=stop_in_messages)

    # The source changes rows the destination already holds: same counts, other contents.
    async with statekeel.open_store(src_url) as src:
        await src.tasks.transition(task.id, "cancelled")
        await src.sessions.expire("s0")

    with pytest.raises(statekeel.ConflictError, match="differ") as info:
        await statekeel.copy_store(src_url, dst_url, batch_size=2, resume=True)
    assert info.value.table in ("sessions", "tasks")  # type: ignore[attr-defined]


async def test_copy_again_over_an_up_to_date_destination_is_verified_row_by_row(tmp_path: Path) -> None:
    src_url, dst_url = _sqlite_url(tmp_path), _sqlite_url(tmp_path, "dst.db")
    async with statekeel.open_store(src_url) as src:
        session = await src.sessions.get_or_create("s")
        session.add_message("user", {"n": 1.5, "nested": {"b": 1, "a": [None, True]}})
        await src.sessions.save(session)
        await src.audit.append("tool_call", "agent", "task-1", {"x": 1})
    first = await statekeel.copy_store(src_url, dst_url, batch_size=1)
    assert first.verified
    again = await statekeel.copy_store(src_url, dst_url, batch_size=1, resume=True)
    assert again.verified and again.copied == 0


@pytest.mark.postgres
async def test_rows_compare_equal_across_backends_despite_jsonb_formatting(
    tmp_path: Path, pg_migrated: str
) -> None:
    src_url = _sqlite_url(tmp_path)
    async with statekeel.open_store(src_url) as src:
        session = await src.sessions.get_or_create("s")
        session.add_message("user", {"zz": 1, "a": {"long key": [1, 2.5, "x"], "b": None}})
        await src.sessions.save(session)
        await src.tasks.create("t", metadata={"b": 2, "a": 1})
    report = await statekeel.copy_store(src_url, pg_migrated)
    assert report.verified
    again = await statekeel.copy_store(src_url, pg_migrated, resume=True)
    assert again.verified and again.copied == 0


@pytest.mark.postgres
async def test_copy_into_non_empty_destination_is_refused_and_writes_nothing(
    tmp_path: Any, pg_migrated: str
) -> None:
    async with statekeel.open_store(_sqlite_url(tmp_path)) as src:
        await _populate(src, sessions=2)
    async with statekeel.open_store(pg_migrated) as dst:
        await dst.backend.append_messages("mine", 0, [message(dst, "keep me")], create=True)
    with pytest.raises(statekeel.ConflictError, match="not empty") as info:
        await statekeel.copy_store(_sqlite_url(tmp_path), pg_migrated)
    assert info.value.table == "sessions"  # type: ignore[attr-defined]
    async with statekeel.open_store(pg_migrated) as dst:
        assert await dst.backend.count_rows("sessions") == 1
        assert await dst.backend.count_rows("messages") == 1


@pytest.mark.postgres
async def test_overwrite_replaces_destination_contents(tmp_path: Any, pg_migrated: str) -> None:
    async with statekeel.open_store(pg_migrated) as dst:
        await dst.backend.append_messages("stale", 0, [message(dst, "old")], create=True)
    async with statekeel.open_store(_sqlite_url(tmp_path)) as src:
        await src.backend.append_messages("fresh", 0, [message(src, "new")], create=True)
    report = await statekeel.copy_store(_sqlite_url(tmp_path), pg_migrated, overwrite=True)
    assert report.overwritten and report.verified
    async with statekeel.open_store(pg_migrated) as dst:
        assert await dst.backend.load_session("stale") is None
        assert [m.payload["content"] for m in await dst.backend.read_messages("fresh")] == ["new"]


async def test_overwrite_refuses_to_delete_audit_entries(tmp_path: Any) -> None:
    src_url, dst_url = _sqlite_url(tmp_path, "a.db"), _sqlite_url(tmp_path, "b.db")
    async with statekeel.open_store(src_url) as src:
        await src.backend.append_messages("s", 0, [message(src, "x")], create=True)
    async with statekeel.open_store(dst_url) as dst:
        await AuditLog(dst.backend, dst.codec).append("k", "actor", "subject", {"keep": True})
    with pytest.raises(statekeel.ConflictError, match="never deleted"):
        await statekeel.copy_store(src_url, dst_url, overwrite=True)
    async with statekeel.open_store(dst_url) as dst:
        assert await dst.backend.count_rows("audit_log") == 1


async def test_copy_between_open_memory_stores(tmp_path: Any) -> None:
    async with statekeel.open_store("memory://") as src, statekeel.open_store("memory://") as dst:
        await _populate(src)
        report = await statekeel.copy_store(src, dst, batch_size=1000)
        assert report.verified
        await _assert_same(src, dst)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": "10"}, "batch_size"),
        ({"resume": True, "overwrite": True}, "not both"),
    ],
)
async def test_bad_copy_arguments_raise_invalid_argument_before_anything_is_opened(
    tmp_path: Any, kwargs: dict[str, Any], match: str
) -> None:
    dst = _sqlite_url(tmp_path, "never.db")
    with pytest.raises(statekeel.InvalidArgument, match=match):
        await statekeel.copy_store(_sqlite_url(tmp_path), dst, **kwargs)
    assert not exists(dst.removeprefix("sqlite:///"))


async def test_copy_refuses_a_store_onto_itself_and_memory_urls(tmp_path: Any) -> None:
    with pytest.raises(statekeel.InvalidArgument, match="same store"):
        await statekeel.copy_store(_sqlite_url(tmp_path), _sqlite_url(tmp_path))
    with pytest.raises(statekeel.InvalidArgument, match="memory"):
        await statekeel.copy_store("memory://", _sqlite_url(tmp_path))


async def _store_precious(store: statekeel.Store) -> None:
    session = await store.sessions.get_or_create("s")
    session.add_message("user", "precious")
    await store.sessions.save(session)
    await store.tasks.create("a task")


async def _precious_still_there(url: str) -> None:
    async with statekeel.open_store(url) as store:
        assert [r.payload["content"] for r in await store.backend.read_messages("s")] == ["precious"]
        assert await store.backend.count_rows("tasks") == 1


# overwrite=True empties the destination before copying: were the destination the source under another
# name (``./a.db`` for ``a.db``, another host spelling, a second open Store), the data would be gone.
@pytest.mark.parametrize("flags", [{"overwrite": True}, {"resume": True}, {}])
async def test_copy_to_the_same_sqlite_file_under_another_url_is_refused(
    tmp_path: Path, flags: dict[str, bool]
) -> None:
    url = _sqlite_url(tmp_path, "a.db")
    async with statekeel.open_store(url) as store:
        await _store_precious(store)
    alias = f"sqlite:///{os.fspath(tmp_path)}/./a.db"
    assert alias != url
    with pytest.raises(statekeel.InvalidArgument, match="same"):
        await statekeel.copy_store(url, alias, **flags)
    await _precious_still_there(url)


async def test_copy_between_two_open_stores_on_one_sqlite_file_is_refused(tmp_path: Path) -> None:
    url = _sqlite_url(tmp_path, "a.db")
    async with statekeel.open_store(url) as src, statekeel.open_store(url) as dst:
        await _store_precious(src)
        with pytest.raises(statekeel.InvalidArgument, match="same"):
            await statekeel.copy_store(src, dst, overwrite=True)
    await _precious_still_there(url)


@pytest.mark.postgres
async def test_copy_to_the_same_postgres_database_under_another_url_is_refused(pg_migrated: str) -> None:
    async with statekeel.open_store(pg_migrated) as store:
        await _store_precious(store)
    alias = pg_migrated.replace("127.0.0.1", "localhost") + "?pool_max_size=3"
    assert alias != pg_migrated
    with pytest.raises(statekeel.InvalidArgument, match="same"):
        await statekeel.copy_store(pg_migrated, alias, overwrite=True)
    await _precious_still_there(pg_migrated)


async def test_copy_between_two_distinct_sqlite_files_is_verified(tmp_path: Path) -> None:
    src = _sqlite_url(tmp_path, "a.db")
    async with statekeel.open_store(src) as store:
        await _store_precious(store)
    report = await statekeel.copy_store(src, "sqlite:///" + os.fspath(tmp_path / "b.db"))
    assert report.verified and report.copied >= 3
    await _precious_still_there(_sqlite_url(tmp_path, "b.db"))


# Tables that copy_store deliberately leaves out: the schema record (the destination has its own), session
# leases and the heartbeats of processes with waiting tool calls (held by live processes of the source,
# meaningless in another store). Incidents describe the physical store they happened to (a SQLite WAL file
# lost): they stay with it. The audit outbox of a store paired with NATS holds entries on their way to the
# chain there: a copy of such a store relays it first and copies the chain.
NOT_COPIED = {
    "schema_migrations",
    "session_leases",
    "owner_heartbeats",
    "store_incidents",
    "audit_outbox",
    "audit_outbox_attempts",
    "message_segments",
}


def _sqlite_tables(path: str) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()


async def test_every_sqlite_table_is_copied_or_deliberately_left_out(tmp_path: Any) -> None:
    url = _sqlite_url(tmp_path, "schema.db")
    async with statekeel.open_store(url):
        pass
    tables = _sqlite_tables(url.removeprefix("sqlite:///"))
    # A new state kind's table must be added to backends/sql/copy.py TABLES (and copy.sql), or here.
    assert tables - NOT_COPIED == {t.name for t in TABLES}


@pytest.mark.postgres
async def test_every_postgres_table_is_copied_or_deliberately_left_out(pg_migrated: str) -> None:
    conn = await asyncpg.connect(pg_migrated)
    try:
        rows = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
            "AND table_type = 'BASE TABLE'"
        )
    finally:
        await conn.close()
    assert {r[0] for r in rows} - NOT_COPIED == {t.name for t in TABLES}


async def test_every_column_of_a_copied_sqlite_table_is_copied(tmp_path: Any) -> None:
    url = _sqlite_url(tmp_path, "schema.db")
    async with statekeel.open_store(url):
        pass
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        for spec in TABLES:
            columns = {r[0] for r in conn.execute("SELECT name FROM pragma_table_info(?)", (spec.name,))}
            # A migration's new column goes into backends/sql/copy.py (and copy.sql), and into
            # imports.ADDED_COLUMNS for the exports written before it: a backup never drops it.
            assert columns == {c for c, _ in spec.columns}, spec.name
    finally:
        conn.close()


@pytest.mark.postgres
async def test_every_column_of_a_copied_postgres_table_is_copied(pg_migrated: str) -> None:
    conn = await asyncpg.connect(pg_migrated)
    try:
        for spec in TABLES:
            rows = await conn.fetch(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
                "AND table_name = $1",
                spec.name,
            )
            assert {r[0] for r in rows} == {c for c, _ in spec.columns}, spec.name
    finally:
        await conn.close()


def test_every_column_a_migration_added_to_a_copied_table_is_filled_for_older_exports() -> None:
    import re

    from statekeel.imports import ADDED_COLUMNS

    copied = {spec.name for spec in TABLES}
    migrations = Path(statekeel.__file__).parent / "backends" / "sqlite" / "migrations"
    added = {}
    for path in sorted(migrations.glob("*.sql")):
        version = int(path.name.split("_", 1)[0])
        for table, column in re.findall(r"ALTER TABLE (\w+) ADD COLUMN (\w+)", path.read_text()):
            if table in copied and version > 12:  # exports began at schema 12
                added[(table, column)] = version
    # An export carries a column from the version that added it, or later (attempt_id from 19: exports
    # of schema 18 left it out).
    assert {k for k, (v, _) in ADDED_COLUMNS.items() if v > 12} == set(added)
    assert all(ADDED_COLUMNS[k][0] >= v for k, v in added.items())


async def _populate_memory(store: statekeel.Store) -> dict[str, str]:
    """Memories with history (updated, forgotten, superseded), an episode, edges (one ended), an open and a
    resolved contradiction, accesses and file records."""
    mem = store.memory
    a = await mem.put("user", "drink", "tea", scope="u1", data={"at": dt.datetime(2026, 1, 2, tzinfo=dt.UTC)})
    await mem.put("user", "drink", "coffee", scope="u1", confidence=0.25, reason="changed her mind")
    b = await mem.put("semantic", None, {"fact": [1, 2.5, -0.0]})
    c = await mem.put("semantic", None, "newer fact")
    await mem.supersede(b.id, c.id, reason="newer", actor="x")
    gone = await mem.put("environment", "cwd", "/tmp")
    await mem.forget(gone.id, reason="stale", actor="x")
    await mem.add_episode("s1", "fixed the test", first_seq=0, upto_seq=9, entities=["tests"])
    edge = await mem.relate("alice", "works_at", "acme", source_memory_id=a.id)
    await mem.unrelate(edge.id)
    await mem.relate("alice", "works_at", "globex", weight=0.5)
    opened = await mem.record_contradiction(a.id, c.id, "open")
    done = await mem.record_contradiction(a.id, b.id, "done")
    await mem.resolve_contradiction(done.id, "b is superseded")
    mem.record_access(a.id, "what does she drink?")
    await mem.flush()
    await store.files.record("src/app.py", "ab" * 32, 10, task_id="t1", action="created")
    await store.files.record("src/app.py", "cd" * 32, 12, task_id="t1")
    await store.files.record("old.txt", None, None, action="deleted")
    return {"a": a.id, "b": b.id, "open": opened.id}


async def _assert_same_memory(src: statekeel.Store, dst: statekeel.Store, ids: dict[str, str]) -> None:
    for memory_id in (ids["a"], ids["b"]):
        assert await dst.memory.history(memory_id) == await src.memory.history(memory_id)
        assert await dst.memory.get(memory_id) == await src.memory.get(memory_id)
    for flags in ({}, {"include_forgotten": True, "include_superseded": True}):
        assert await dst.memory.query(**flags) == await src.memory.query(**flags)
    assert await dst.memory.episodes() == await src.memory.episodes()
    assert await dst.memory.relations("alice") == await src.memory.relations("alice")
    assert [c.id for c in await dst.memory.open_contradictions()] == [ids["open"]]
    assert await dst.memory.accesses(ids["a"]) == await src.memory.accesses(ids["a"])
    assert await dst.files.list() == await src.files.list()
    # The copy is a working store: a put continues the copied history.
    updated = await dst.memory.put("user", "drink", "water", scope="u1")
    assert updated.id == ids["a"] and updated.version == 3


async def test_copy_moves_memories_their_history_and_the_file_ledger(tmp_path: Any) -> None:
    async with statekeel.open_store("memory://") as src, statekeel.open_store("memory://") as dst:
        ids = await _populate_memory(src)
        report = await statekeel.copy_store(src, dst, batch_size=2)
        assert report.verified
        counts = {t.table: t.destination_rows for t in report.tables}
        assert counts["memories"] == 4 and counts["memory_events"] == 7 and counts["file_changes"] == 3
        await _assert_same_memory(src, dst, ids)


@pytest.mark.postgres
async def test_copy_moves_memories_and_files_from_sqlite_to_postgres(tmp_path: Any, pg_migrated: str) -> None:
    async with statekeel.open_store(_sqlite_url(tmp_path)) as src:
        ids = await _populate_memory(src)
    report = await statekeel.copy_store(_sqlite_url(tmp_path), pg_migrated, batch_size=3)
    assert report.verified
    async with statekeel.open_store(_sqlite_url(tmp_path)) as src, statekeel.open_store(pg_migrated) as dst:
        await _assert_same_memory(src, dst, ids)


async def test_overwrite_refuses_to_delete_open_contradictions(tmp_path: Any) -> None:
    src_url, dst_url = _sqlite_url(tmp_path, "a.db"), _sqlite_url(tmp_path, "b.db")
    async with statekeel.open_store(src_url) as src:
        await src.memory.put("user", "k", "v")
    async with statekeel.open_store(dst_url) as dst:
        a = await dst.memory.put("user", None, "a")
        b = await dst.memory.put("user", None, "b")
        await dst.memory.record_contradiction(a.id, b.id, "unresolved")
    with pytest.raises(statekeel.ConflictError, match="never deleted"):
        await statekeel.copy_store(src_url, dst_url, overwrite=True)
    async with statekeel.open_store(dst_url) as dst:
        assert len(await dst.memory.open_contradictions()) == 1
        assert await dst.backend.count_rows("memories") == 2


@pytest.mark.postgres
async def test_copy_carries_forks_rewinds_and_usage(tmp_path: Any, pg_migrated: str) -> None:
    async with statekeel.open_store(_sqlite_url(tmp_path)) as src:
        s = await src.sessions.get_or_create("z-parent")
        for i in range(5):
            s.add_message("assistant", f"m{i}", usage={"model": "m", "input_tokens": i + 1})
        await src.sessions.save(s)
        await src.sessions.compress("z-parent", 1, "first")
        rewind = await src.sessions.rewind("z-parent", 4, reason="undo m4")
        fork = await src.sessions.fork("z-parent", 3, new_key="a-fork")  # sorts before its parent
        fork.add_message("user", "f3", usage={"model": "n", "output_tokens": 7, "cost": 0.5})
        await src.sessions.save(fork)
    report = await statekeel.copy_store(_sqlite_url(tmp_path), pg_migrated, batch_size=2)
    assert report.verified
    async with statekeel.open_store(_sqlite_url(tmp_path)) as src, statekeel.open_store(pg_migrated) as dst:
        for key in ("z-parent", "a-fork"):
            assert await dst.backend.load_session_with_messages(
                key, include_archived=True
            ) == await src.backend.load_session_with_messages(key, include_archived=True)
            assert await dst.sessions.usage(key) == await src.sessions.usage(key)
        copied = await dst.sessions.load("a-fork")
        assert copied is not None and copied.parent == ("z-parent", 3)
        assert [m["content"] for m in copied.messages] == ["m0", "m1", "m2", "f3"]
        assert [
            a.payload["content"] for a in await dst.sessions.archived("z-parent", rewind.compression_id)
        ] == ["m4"]
        assert [b.key for b in await dst.sessions.branches("z-parent")] == ["a-fork"]
