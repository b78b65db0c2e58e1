"""store.erase: everything about one subject goes, in batches that re-check the subject; everything else
stays; one erasure audit entry records who, why and the counts."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

import statekeel
from statekeel.erasure import subject_digest

SUBJECT = "user:alice"


async def fill(store: statekeel.Store) -> dict[str, Any]:
    """The subject's state of every erasable kind, and someone else's next to it."""
    ids: dict[str, Any] = {}
    for key, meta, n in (
        (SUBJECT, {}, 6),
        ("chat-7", {"subject": SUBJECT}, 4),
        ("chat-8", {"subject": "bob"}, 3),
    ):
        session = await store.sessions.get_or_create(key)
        session.metadata.update(meta)
        for i in range(n):
            session.add_message("user", f"{key} {i}")
        await store.sessions.save(session)
    await store.sessions.compress("chat-7", 2, "summary")
    mine = await store.memory.put("user", "name", "Alice", scope=SUBJECT)
    mine2 = await store.memory.put("user", "city", "Lyon", scope=SUBJECT)
    await store.memory.put("user", "city", "Paris", scope=SUBJECT)  # an UPDATE: two events
    theirs = await store.memory.put("user", "name", "Bob", scope="bob")
    ids["theirs"] = theirs.id
    await store.memory.record_contradiction(mine.id, theirs.id, "both named")  # open, across subjects
    await store.memory.record_contradiction(mine.id, mine2.id, "within")
    await store.memory.relate(SUBJECT, "knows", "bob")
    await store.memory.relate("bob", "knows", SUBJECT)
    await store.memory.relate("bob", "likes", "tea")
    await store.memory.relate("x", "from", "y", source_memory_id=mine.id)
    await store.memory.add_episode("chat-7", "talked")
    await store.memory.add_episode("chat-8", "bob talked")
    await store.memory.add_episode("chat-8", "bob met alice", entities=["bob", SUBJECT])
    await store.memory.add_episode("chat-7", "again", entities=[SUBJECT])  # counted with its session
    await store.files.record("notes/a.txt", "ab" * 32, 3, session_key="chat-7")
    await store.files.record("notes/b.txt", "cd" * 32, 3, session_key="chat-8")
    now = dt.datetime.now(dt.UTC)
    span = {"name": "llm", "kind": "llm", "status": "ok", "started_at": now}
    store.traces.record("chat-7", {**span, "span_id": "s1", "attributes": {}})
    store.traces.record("t-1", {**span, "span_id": "s1", "attributes": {"session_key": SUBJECT}})
    store.traces.record("t-2", {**span, "span_id": "s1", "attributes": {"subject": SUBJECT}})
    store.traces.record("t-3", {**span, "span_id": "s1", "attributes": {"session_key": "chat-8"}})
    await store.traces.flush()
    await store.vectors.upsert("v-mine", mine.id, [1.0, 0.0], model="tiny")
    await store.vectors.upsert("v-theirs", theirs.id, [0.0, 1.0], model="tiny")
    await store.vectors.upsert("v-chat", "chat-7", [0.5, 0.5], model="tiny")
    return ids


EXPECTED = {
    "sessions": 2,
    "messages": 8,
    "archived_messages": 2,
    "compressions": 1,
    "tool_calls": 0,
    "fallback_files": 0,
    "episodes": 3,
    "memories": 2,
    "memory_events": 3,
    "memory_accesses": 0,
    "contradictions": 2,
    "relations": 3,
    "vectors": 2,
    "traces": 3,
    "checkpoints": 0,
    "file_changes": 1,
}


async def test_erase_removes_everything_of_the_subject_and_nothing_else(store: statekeel.Store) -> None:
    ids = await fill(store)
    before = await store.audit.verify()
    report = await store.erase(SUBJECT, actor="dpo", reason="request 113")
    assert report.counts == EXPECTED
    assert not report.dry_run and report.leases_held == 0
    for key in (SUBJECT, "chat-7"):
        assert await store.sessions.load(key) is None
    bob = await store.sessions.load("chat-8")
    assert bob is not None and len(bob.messages) == 3
    assert [m.content for m in (await store.memory.query(scope=SUBJECT, include_superseded=True)).items] == []
    theirs = await store.memory.get(ids["theirs"])
    assert theirs is not None and theirs.content == "Bob"
    assert await store.memory.open_contradictions() == []
    assert [(r.subject, r.object) for r in await store.memory.relations("bob")] == [("bob", "tea")]
    assert [e.summary for e in await store.memory.episodes()] == ["bob talked"]
    assert [f.path for f in await store.files.list()] == ["notes/b.txt"]
    assert [s.trace_id for s in (await store.traces.query()).items] == ["t-3"]
    assert [v.vec_id for v in await store.vectors.by_source(ids["theirs"])] == ["v-theirs"]
    assert await store.vectors.by_source("chat-7") == []
    # The audit chain stays whole; one erasure entry names the subject by its hash only.
    verification = await store.audit.verify()
    assert verification.ok and verification.count == before.count + 1
    entry = (await store.audit.query(kind="erasure"))[-1]
    assert entry.seq == report.audit_seq and entry.actor == "dpo"
    assert entry.subject == f"sha256:{subject_digest(SUBJECT)}"
    assert entry.data["reason"] == "request 113" and entry.data["counts"] == EXPECTED
    assert SUBJECT not in str(entry.data)


async def test_a_dry_run_counts_what_erase_deletes_and_writes_nothing(store: statekeel.Store) -> None:
    await fill(store)
    tables = await store.backend.copy_tables()
    before = {t.name: await store.backend.count_rows(t.name) for t in tables}
    dry = await store.erase(SUBJECT, dry_run=True, actor="dpo", reason="preview")
    assert dry.dry_run and dry.audit_seq is None
    assert {t.name: await store.backend.count_rows(t.name) for t in tables} == before
    assert dry.counts == EXPECTED
    assert (await store.erase(SUBJECT, actor="dpo", reason="now")).counts == dry.counts


async def test_a_subject_that_matches_nothing_gives_zeros(store: statekeel.Store) -> None:
    await fill(store)
    report = await store.erase("nobody", actor="dpo", reason="request 114")
    assert report.total == 0 and set(report.counts.values()) == {0}
    assert (await store.sessions.load("chat-8")) is not None
    again = await store.erase(SUBJECT, actor="dpo", reason="x")
    assert again.counts == EXPECTED
    assert (await store.erase(SUBJECT, actor="dpo", reason="x")).total == 0  # idempotent


@pytest.mark.parametrize("subject", ["", 7, None, b"alice", "a\x00b"])
async def test_a_bad_subject_raises_a_typed_error_before_anything_is_written(
    store: statekeel.Store, subject: Any
) -> None:
    await fill(store)
    with pytest.raises(statekeel.InvalidKey):
        await store.erase(subject, actor="dpo", reason="x")
    assert (await store.sessions.load(SUBJECT)) is not None
    assert (await store.audit.query(kind="erasure")) == []


@pytest.mark.parametrize(
    ("actor", "reason", "error"),
    [
        ("", "x", statekeel.InvalidKey),
        ("dpo", "", statekeel.InvalidArgument),
        (None, "x", statekeel.InvalidKey),
    ],
)
async def test_erase_needs_an_actor_and_a_reason(
    store: statekeel.Store, actor: Any, reason: Any, error: type[Exception]
) -> None:
    await fill(store)
    with pytest.raises(error):
        await store.erase(SUBJECT, actor=actor, reason=reason)
    assert (await store.sessions.load(SUBJECT)) is not None


async def test_a_session_that_no_longer_names_the_subject_is_not_deleted(store: statekeel.Store) -> None:
    # The session was listed as the subject's, then its metadata changed before the batch deleted it.
    await fill(store)
    keys = await store.backend.erasure_sessions(SUBJECT, after=None, limit=100)
    assert keys == ["chat-7", SUBJECT]
    session = await store.sessions.load("chat-7")
    assert session is not None
    session.metadata["subject"] = "carol"
    await store.sessions.save(session)
    batch = await store.backend.erase_sessions(SUBJECT, keys, now=dt.datetime.now(dt.UTC), dry_run=False)
    assert batch.counts["sessions"] == 1
    kept = await store.sessions.load("chat-7")
    assert kept is not None and kept.metadata["subject"] == "carol" and kept.head_seq == 4
    # What belongs to it stays with it: its episodes, file records and the trace named after it.
    assert [e.session_key for e in await store.memory.episodes(session_key="chat-7")] == ["chat-7", "chat-7"]
    assert [f.path for f in await store.files.list(session_key="chat-7")] == ["notes/a.txt"]
    assert [s.trace_id for s in await store.traces.get("chat-7")] == ["chat-7"]
    assert await store.sessions.load(SUBJECT) is None


async def test_a_lease_held_by_a_live_holder_is_kept(store: statekeel.Store) -> None:
    await fill(store)
    async with store.sessions.lock("chat-7"):
        report = await store.erase(SUBJECT, actor="dpo", reason="x")
    assert report.sessions == 2 and report.leases_held == 1
    assert await store.sessions.load("chat-7") is None


async def test_erase_works_in_small_batches(store: statekeel.Store) -> None:
    await fill(store)
    for i in range(5):
        session = await store.sessions.get_or_create(f"extra-{i}")
        session.metadata["subject"] = SUBJECT
        session.add_message("user", "more")
        await store.sessions.save(session)
    report = await store.erase(SUBJECT, actor="dpo", reason="x", batch_size=1)
    assert report.sessions == 7 and report.memories == 2
    assert report.batches >= 7 + 2


async def test_what_is_named_after_the_subject_goes_without_a_session_of_that_key(
    store: statekeel.Store,
) -> None:
    # A LangGraph thread and a trace named after the subject, and an episode of that key: no session.
    info = {t.name: t for t in await store.backend.copy_tables()}
    for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
        plain = {"text": "x", "int": 1, "json": "{}", "ts": dt.datetime.now(dt.UTC), "bytes": b"x"}
        row = tuple(SUBJECT if c == "thread_id" else plain[k] for c, k in info[table].columns)
        await store.backend.import_rows(table, [row])
    span = {"span_id": "s", "name": "n", "kind": "llm", "status": "ok", "attributes": {}}
    store.traces.record(SUBJECT, {**span, "started_at": dt.datetime.now(dt.UTC)})
    store.traces.record("other", {**span, "started_at": dt.datetime.now(dt.UTC)})
    await store.traces.flush()
    await store.memory.add_episode(SUBJECT, "no session")
    report = await store.erase(SUBJECT, actor="dpo", reason="x")
    assert (report.sessions, report.checkpoints, report.traces, report.episodes) == (0, 3, 1, 1)
    for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
        assert await store.backend.count_rows(table) == 0
    assert [s.trace_id for s in (await store.traces.query()).items] == ["other"]
