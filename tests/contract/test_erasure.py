"""store.erase: everything about one subject goes, in batches that re-check the subject; everything else
stays; one erasure audit entry records who, why and the counts."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import statekeel
from statekeel.codec.keyring import open_keyring
from statekeel.erasure import subject_digest

SUBJECT = "user:alice"
KEY = bytes(range(32))


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
    "rewound_messages": 0,
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


async def test_erase_deletes_and_counts_the_messages_its_sessions_rewinds_took_out(
    store: statekeel.Store,
) -> None:
    await _chat(store, SUBJECT, 6)
    await _chat(store, "chat-8", 4, subject="bob")
    await store.sessions.rewind(SUBJECT, 3, reason="retry turn 3")
    await store.sessions.rewind("chat-8", 2, reason="bob's retry")
    async with store.sessions.open(SUBJECT) as session:
        session.add_message("user", "turn 3 again")
    dry = await store.erase(SUBJECT, dry_run=True, actor="dpo", reason="preview")
    assert (dry.messages, dry.rewound_messages, dry.compressions) == (4, 3, 1)
    report = await store.erase(SUBJECT, actor="dpo", reason="request 113")
    assert report.counts == dry.counts
    assert (report.messages, report.rewound_messages, report.compressions) == (4, 3, 1)
    assert report.total == 1 + 4 + 3 + 1
    entry = (await store.audit.query(kind="erasure"))[-1]
    assert entry.data["counts"]["rewound_messages"] == 3
    # The rewound rows are gone with their session; a new session of the key has none, bob keeps his.
    assert await store.backend.session_rewinds(SUBJECT) == []
    assert [r.reason for r in await store.sessions.rewinds("chat-8")] == ["bob's retry"]
    again = await store.erase(SUBJECT, actor="dpo", reason="request 113")
    assert again.total == 0


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


async def fill_sessions_and_spans(store: statekeel.Store) -> None:
    """The subject's sessions (one compressed) and spans, and someone else's: what every store holds."""
    for key, meta, n in (
        (SUBJECT, {}, 3),
        ("chat-7", {"subject": SUBJECT}, 4),
        ("chat-8", {"subject": "bob"}, 2),
    ):
        session = await store.sessions.get_or_create(key)
        session.metadata.update(meta)
        for i in range(n):
            session.add_message("user", f"{key} {i}")
        await store.sessions.save(session)
    await store.sessions.compress("chat-7", 2, "summary")
    span = {
        "span_id": "s1",
        "name": "llm",
        "kind": "llm",
        "status": "ok",
        "started_at": dt.datetime.now(dt.UTC),
    }
    store.traces.record("chat-7", {**span, "attributes": {}})
    store.traces.record("t-1", {**span, "attributes": {"session_key": SUBJECT}})
    store.traces.record("t-2", {**span, "attributes": {"subject": SUBJECT}})
    store.traces.record("t-3", {**span, "attributes": {"session_key": "chat-8"}})
    await store.traces.flush()


@pytest.mark.kinds("sessions", "tool_calls", "audit", "traces", "erasure")
async def test_erase_on_a_store_of_sessions_and_traces_removes_the_subjects_and_keeps_a_live_lease(
    store: statekeel.Store,
) -> None:
    await fill_sessions_and_spans(store)
    before = await store.audit.verify()
    dry = await store.erase(SUBJECT, dry_run=True, actor="dpo", reason="preview")
    assert await store.sessions.load("chat-7") is not None and len((await store.traces.query()).items) == 4
    async with store.sessions.lock("chat-7"):
        report = await store.erase(SUBJECT, actor="dpo", reason="request 115")
    assert (report.sessions, report.messages, report.archived_messages, report.compressions) == (2, 5, 2, 1)
    assert report.traces == 3 and report.leases_held == 1 and report.counts == dry.counts
    assert report.session_keys == ("chat-7", SUBJECT)
    for key in (SUBJECT, "chat-7"):
        assert await store.sessions.load(key) is None
    assert [s.key for s in (await store.sessions.list()).items] == ["chat-8"]
    assert [s.trace_id for s in (await store.traces.query()).items] == ["t-3"]
    verification = await store.audit.verify()
    assert verification.ok and verification.count == before.count + 1
    entry = (await store.audit.query(kind="erasure"))[-1]
    assert entry.seq == report.audit_seq and entry.data["counts"] == report.counts
    again = await store.erase(SUBJECT, actor="dpo", reason="request 115, after the lease")
    assert again.sessions == 0 and again.leases_held == 0  # the lease was released: its row goes now


async def _chat(store: statekeel.Store, key: str, n: int, subject: str | None = None) -> None:
    session = await store.sessions.get_or_create(key)
    if subject is not None:
        session.metadata["subject"] = subject
    for i in range(n):
        session.add_message("user", f"{key} {i}")
    await store.sessions.save(session)


async def _fork(store: statekeel.Store, key: str, at: int, new_key: str, metadata: Any = None) -> None:
    fork = await store.sessions.fork(key, at, new_key=new_key)
    if metadata is not None:
        fork.metadata.clear()
        fork.metadata.update(metadata)
    fork.add_message("user", f"{new_key} own")
    await store.sessions.save(fork)


async def _forks_of_the_subject(store: statekeel.Store) -> None:
    """The subject's session (named by its key alone), a fork of it, a fork of that fork that names
    someone else, a fork of a session that names the subject by metadata, and bob's own session."""
    await _chat(store, SUBJECT, 4)
    await _fork(store, SUBJECT, 2, "retry")  # its metadata is the parent's: empty
    await _fork(store, "retry", 3, "retry-2", {"subject": "bob"})
    await _chat(store, "chat-7", 3, SUBJECT)
    await _fork(store, "chat-7", 1, "chat-7b", {})
    await _chat(store, "chat-8", 2, "bob")
    await store.memory.add_episode("retry-2", "a fork's episode")
    await store.files.record("notes/r.txt", "ef" * 32, 3, session_key="retry")


async def test_erasing_a_session_erases_its_forks_and_their_forks(store: statekeel.Store) -> None:
    await _forks_of_the_subject(store)
    report = await store.erase(SUBJECT, actor="dpo", reason="x")
    # Each fork is counted with its own messages (what it inherited is its parent's rows).
    assert (report.sessions, report.messages, report.episodes, report.file_changes) == (
        5,
        4 + 1 + 1 + 3 + 1,
        1,
        1,
    )
    assert set(report.session_keys) == {SUBJECT, "retry", "retry-2", "chat-7", "chat-7b"}
    for key in report.session_keys:
        assert await store.sessions.load(key) is None  # gone, not left failing with StorageCorrupt
        assert await store.sessions.branches(key) == []
    assert await store.memory.episodes() == [] and await store.files.list() == []
    bob = await store.sessions.load("chat-8")
    assert bob is not None and len(bob.messages) == 2
    assert [r.key for r in (await store.sessions.list()).items] == ["chat-8"]
    assert (await store.erase(SUBJECT, actor="dpo", reason="again")).total == 0


async def test_a_dry_run_counts_the_forks_erase_deletes(store: statekeel.Store) -> None:
    await _forks_of_the_subject(store)
    dry = await store.erase(SUBJECT, dry_run=True, actor="dpo", reason="preview")
    assert dry.sessions == 5 and dry.messages == 10
    assert (await store.sessions.load("retry-2")) is not None
    assert (await store.erase(SUBJECT, actor="dpo", reason="now")).counts == dry.counts


async def test_erasing_a_fork_leaves_its_parent_and_its_siblings_whole(store: statekeel.Store) -> None:
    await _chat(store, "chat-8", 4, "bob")
    await _fork(store, "chat-8", 2, SUBJECT)
    await _fork(store, "chat-8", 3, "sibling")
    await _fork(store, SUBJECT, 3, "grandchild")
    report = await store.erase(SUBJECT, actor="dpo", reason="x")
    assert report.sessions == 2 and report.messages == 2
    parent = await store.sessions.load("chat-8")
    assert parent is not None and [m["content"] for m in parent.messages] == [f"chat-8 {i}" for i in range(4)]
    sibling = await store.sessions.load("sibling")
    assert sibling is not None and [m["content"] for m in sibling.messages][-1] == "sibling own"
    assert [b.key for b in await store.sessions.branches("chat-8")] == ["sibling"]
    assert await store.sessions.load("grandchild") is None


async def test_a_fork_made_after_the_candidates_were_listed_goes_with_its_parent(
    store: statekeel.Store,
) -> None:
    await _chat(store, SUBJECT, 3)
    keys = await store.backend.erasure_sessions(SUBJECT, after=None, limit=100)
    assert keys == [SUBJECT]
    await _fork(store, SUBJECT, 2, "late")
    await _fork(store, "late", 3, "later")
    batch = await store.backend.erase_sessions(SUBJECT, keys, now=dt.datetime.now(dt.UTC), dry_run=False)
    assert batch.counts["sessions"] == 3
    store.sessions.evict("late")
    store.sessions.evict("later")
    assert await store.sessions.load("late") is None and await store.sessions.load("later") is None


async def test_a_fork_of_a_session_named_by_the_subject_through_an_ancestor_is_kept_once_it_no_longer_is(
    store: statekeel.Store,
) -> None:
    # Listed as the subject's (a fork of chat-7), then chat-7 stopped naming the subject: both stay.
    await _chat(store, "chat-7", 3, SUBJECT)
    await _fork(store, "chat-7", 2, "fork-7", {})
    keys = await store.backend.erasure_sessions(SUBJECT, after=None, limit=100)
    assert keys == ["chat-7", "fork-7"]
    session = await store.sessions.load("chat-7")
    assert session is not None
    session.metadata["subject"] = "carol"
    await store.sessions.save(session)
    batch = await store.backend.erase_sessions(SUBJECT, keys, now=dt.datetime.now(dt.UTC), dry_run=False)
    assert batch.counts.get("sessions", 0) == 0
    fork = await store.sessions.load("fork-7")
    assert fork is not None and [m["content"] for m in fork.messages] == [
        "chat-7 0",
        "chat-7 1",
        "fork-7 own",
    ]


async def test_forks_made_while_the_erasure_runs_are_erased_or_refused(store: statekeel.Store) -> None:
    await _chat(store, SUBJECT, 3)
    await _fork(store, SUBJECT, 2, "f0")

    async def fork(parent: str, new_key: str) -> str:
        try:
            await store.sessions.fork(parent, 1, new_key=new_key)
        except statekeel.errors.NotFound:
            return "refused"
        return "made"

    outcomes = await asyncio.gather(
        store.erase(SUBJECT, actor="dpo", reason="x"),
        *(fork(SUBJECT if i % 2 else "f0", f"race-{i}") for i in range(8)),
    )
    assert set(outcomes[1:]) <= {"made", "refused"}
    # Whatever the interleaving: a fork made before the erasure listed its candidates is one of them, one
    # made before its parent's batch is erased in that batch, and one made after it finds its parent gone.
    for i in range(8):
        store.sessions.evict(f"race-{i}")
        assert await store.sessions.load(f"race-{i}") is None
    assert (await store.sessions.list()).items == []


KEYS = (SUBJECT, "chat-1", "chat-2", "chat-3")
erasure_mix = st.fixed_dictionaries(
    {
        "sessions": st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from([SUBJECT, "bob", None])),
                             max_size=4, unique_by=lambda t: t[0]),
        "memories": st.lists(st.tuples(st.sampled_from([SUBJECT, "bob"]), st.booleans()), max_size=5),
        "contradictions": st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4), st.booleans()),
                                   max_size=3),
        "relations": st.lists(st.tuples(st.sampled_from([SUBJECT, "bob", "tea"]),
                                        st.sampled_from([SUBJECT, "bob", "tea"]), st.integers(-1, 4)),
                              max_size=4),
        "episodes": st.lists(st.tuples(st.sampled_from(KEYS), st.booleans()), max_size=3),
        "spans": st.lists(st.tuples(st.sampled_from((*KEYS, "t-x")),
                                    st.sampled_from(["subject", "session_key", None]),
                                    st.sampled_from(KEYS)), max_size=4),
        "files": st.lists(st.sampled_from(KEYS), max_size=3),
        "batch_size": st.integers(1, 3),
    }
)  # fmt: skip


async def _build_mix(store: statekeel.Store, spec: dict[str, Any]) -> None:
    for key, owner in spec["sessions"]:
        session = await store.sessions.get_or_create(key)
        if owner is not None:
            session.metadata["subject"] = owner
        session.add_message("user", f"{key} hello")
        await store.sessions.save(session)
    memories = []
    for i, (scope, vector) in enumerate(spec["memories"]):
        memory = await store.memory.put("user", f"k{i}", f"v{i}", scope=scope)
        memories.append(memory)
        store.memory.record_access(memory.id)
        if vector:
            await store.vectors.upsert(f"v{i}", memory.id, [1.0, float(i)], model="m")
    for a, b, resolved in spec["contradictions"]:
        if a < len(memories) and b < len(memories) and a != b:
            c = await store.memory.record_contradiction(memories[a].id, memories[b].id, "x")
            if resolved:
                await store.memory.resolve_contradiction(c.id, "settled")
    for subject, obj, source in spec["relations"]:
        source_id = memories[source].id if 0 <= source < len(memories) else None
        await store.memory.relate(subject, "r", obj, source_memory_id=source_id)
    for key, names in spec["episodes"]:
        await store.memory.add_episode(key, "e", entities=[SUBJECT] if names else ["bob"])
    for n, (trace, attribute, value) in enumerate(spec["spans"]):
        attributes = {} if attribute is None else {attribute: value}
        span = {"span_id": f"s{n}", "name": "n", "kind": "llm", "status": "ok", "attributes": attributes}
        store.traces.record(trace, {**span, "started_at": dt.datetime.now(dt.UTC)})
    for n, key in enumerate(spec["files"]):
        await store.files.record(f"f{n}.txt", "ab" * 32, 1, session_key=key)
    await store.memory.flush()
    await store.traces.flush()


def _records(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().split(b"\n")[1:] if line]


def _expected_survivors(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The spec of erasure, written independently of the code: the records that must remain."""
    rows = [(r["kind"], r["row"]) for r in records]
    keys = {SUBJECT} | {
        row["key"] for kind, row in rows if kind == "sessions" and row["metadata"].get("subject") == SUBJECT
    }
    memories = {row["id"] for kind, row in rows if kind == "memories" and row["scope"] == SUBJECT}
    episodes = {
        row["id"]
        for kind, row in rows
        if kind == "memory_episodes" and (row["session_key"] in keys or SUBJECT in row["entities"])
    }
    sources = memories | keys | episodes

    def gone(kind: str, row: dict[str, Any]) -> bool:
        if kind in ("sessions",):
            return row["key"] in keys
        if kind in ("messages", "compressions", "message_archive", "session_steps", "file_changes"):
            return row["session_key"] in keys
        if kind == "memory_episodes":
            return row["id"] in episodes
        if kind == "traces":
            attrs = row["attributes"]
            return (
                row["trace_id"] in keys or attrs.get("subject") == SUBJECT or attrs.get("session_key") in keys
            )
        if kind == "memories":
            return row["id"] in memories
        if kind in ("memory_events", "memory_accesses"):
            return row["memory_id"] in memories
        if kind == "memory_contradictions":
            return row["memory_a"] in memories or row["memory_b"] in memories
        if kind == "memory_relations":
            return SUBJECT in (row["subject"], row["object"]) or row["source_memory_id"] in memories
        if kind in ("vectors", "vector_sources"):
            return row["source_id"] in sources
        return False

    return [
        {"kind": k, "row": r} for k, r in rows if not gone(k, r) and k not in ("vector_models", "audit_log")
    ]


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(spec=erasure_mix)
def test_erase_removes_exactly_the_subjects_records_whatever_the_mix(
    spec: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("mix")

    async def run() -> None:
        async with statekeel.open_store("memory://") as store:
            await _build_mix(store, spec)
            await statekeel.export_store(store, folder / "before.jsonl")
            dry = await store.erase(
                SUBJECT, dry_run=True, actor="dpo", reason="r", batch_size=spec["batch_size"]
            )
            real = await store.erase(SUBJECT, actor="dpo", reason="r", batch_size=spec["batch_size"])
            assert dry.counts == real.counts
            await statekeel.export_store(store, folder / "after.jsonl")
            assert (await store.audit.verify()).ok
        before, after = _records(folder / "before.jsonl"), _records(folder / "after.jsonl")
        survivors = [r for r in after if r["kind"] not in ("vector_models", "audit_log")]
        expected = _expected_survivors(before)

        def key(r: dict[str, Any]) -> bytes:
            return orjson.dumps(r, option=orjson.OPT_SORT_KEYS)

        assert sorted(map(key, survivors)) == sorted(map(key, expected))
        removed = sum(1 for r in before if r["kind"] == "sessions") - sum(
            1 for r in after if r["kind"] == "sessions"
        )
        assert real.sessions == removed

    asyncio.run(run())


# --- with a key ring: erasure destroys the subject's data keys, so old backups no longer open -------------


@pytest.fixture
async def ringed(store_url: str, tmp_path: Path) -> AsyncIterator[tuple[statekeel.Store, str]]:
    """An encrypted store with a key ring on each backend, and the ring's path."""
    ring = await statekeel.create_keyring(tmp_path / "keys" / "ring.db", KEY)
    s = await statekeel.open_store(
        store_url, fallback_dir=str(tmp_path / "fallback"), encryption_key=KEY, keyring=ring
    )
    try:
        yield s, ring
    finally:
        await s.close()


async def _subjects_memory(store: statekeel.Store) -> str:
    return (await store.memory.query(scope=SUBJECT, include_superseded=True)).items[0].id


async def check_backup(path: Path, ring: str, ids: dict[str, Any], mine: str) -> None:
    """The copy taken before the erasure: the subject's values raise SubjectErased, the others read."""
    async with statekeel.open_store(f"sqlite:///{path}", encryption_key=KEY, keyring=ring) as old:
        for key in (SUBJECT, "chat-7"):
            with pytest.raises(statekeel.SubjectErased) as info:
                await old.backend.read_messages(key, start=0)
            assert info.value.kind == "message" and info.value.record[0] == key
            with pytest.raises(statekeel.SubjectErased):
                await old.sessions.load(key)
        with pytest.raises(statekeel.SubjectErased):
            await old.sessions.archived("chat-7")
        with pytest.raises(statekeel.SubjectErased) as info:
            await old.memory.get(mine)
        assert info.value.kind == "memory"
        bob = await old.sessions.load("chat-8")
        assert bob is not None and [m["content"] for m in bob.messages] == [f"chat-8 {i}" for i in range(3)]
        theirs = await old.memory.get(ids["theirs"])
        assert theirs is not None and theirs.content == "Bob"


async def test_with_a_key_ring_a_backup_taken_before_the_erasure_no_longer_opens_the_subjects_data(
    ringed: tuple[statekeel.Store, str], tmp_path: Path
) -> None:
    store, ring = ringed
    ids = await fill(store)
    mine = await _subjects_memory(store)
    await store.backup(tmp_path / "before.db")
    report = await store.erase(SUBJECT, actor="dpo", reason="request 113")
    assert report.counts == EXPECTED
    # "user:alice" (its session and its memories' scope share one key) and "chat-7".
    assert report.data_keys == 2
    entry = (await store.audit.query(kind="erasure"))[-1]
    assert entry.data["data_keys"] == 2 and entry.data["counts"] == EXPECTED
    await check_backup(tmp_path / "before.db", ring, ids, mine)
    bob = await store.sessions.load("chat-8")  # the store itself reads the others as before
    assert bob is not None and len(bob.messages) == 3
    # A session of the erased key started afterwards gets a new data key, and reads.
    async with store.sessions.open(SUBJECT) as again:
        again.add_message("user", "new start")
    fresh = await store.backend.read_messages(SUBJECT, start=0)
    assert [m.payload["content"] for m in fresh] == ["new start"]
    assert (await store.erase(SUBJECT, actor="dpo", reason="again")).data_keys == 1


async def test_a_dry_run_counts_the_data_keys_and_destroys_none(
    ringed: tuple[statekeel.Store, str], tmp_path: Path
) -> None:
    store, ring = ringed
    await fill(store)
    await store.backup(tmp_path / "before.db")
    dry = await store.erase(SUBJECT, dry_run=True, actor="dpo", reason="preview")
    assert dry.data_keys == 2 and dry.counts == EXPECTED
    async with statekeel.open_store(
        f"sqlite:///{tmp_path / 'before.db'}", encryption_key=KEY, keyring=ring
    ) as old:
        assert len(await old.backend.read_messages("chat-7", start=0)) == 2  # 2 of 4 were archived


async def test_an_erasure_interrupted_between_the_rows_and_the_keys_is_finished_by_the_next_run(
    ringed: tuple[statekeel.Store, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, ring = ringed
    ids = await fill(store)
    mine = await _subjects_memory(store)
    await store.backup(tmp_path / "before.db")
    assert store.codec.cipher is not None and store.codec.cipher.ring is not None

    def dies(subject: str, spare: Any = ()) -> int:
        raise statekeel.BackendUnavailable("injected: the process died before the keys went")

    monkeypatch.setattr(store.codec.cipher.ring, "destroy", dies)
    with pytest.raises(statekeel.BackendUnavailable, match="injected"):
        await store.erase(SUBJECT, actor="dpo", reason="request 113")
    monkeypatch.undo()
    assert await store.sessions.load("chat-7") is None  # the rows went; no session names the keys now
    report = await store.erase(SUBJECT, actor="dpo", reason="request 113")
    assert report.total == 0 and report.data_keys == 2  # the keys marked by the first run
    assert [e.data["data_keys"] for e in await store.audit.query(kind="erasure")] == [2]
    await check_backup(tmp_path / "before.db", ring, ids, mine)


async def test_an_erasure_interrupted_after_the_keys_is_finished_by_the_next_run(
    ringed: tuple[statekeel.Store, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, ring = ringed
    ids = await fill(store)
    mine = await _subjects_memory(store)
    await store.backup(tmp_path / "before.db")

    async def dies(*args: Any, **kwargs: Any) -> Any:
        raise statekeel.BackendUnavailable("injected: the process died before the audit entry")

    monkeypatch.setattr(store.audit, "append", dies)
    with pytest.raises(statekeel.BackendUnavailable, match="injected"):
        await store.erase(SUBJECT, actor="dpo", reason="request 113")
    monkeypatch.undo()
    await check_backup(tmp_path / "before.db", ring, ids, mine)  # the keys are gone already
    report = await store.erase(SUBJECT, actor="dpo", reason="request 113")
    assert report.total == 0 and report.data_keys == 0 and report.audit_seq is not None


async def test_without_a_key_ring_erasure_deletes_rows_and_a_backup_keeps_what_it_held(
    store_url: str, tmp_path: Path
) -> None:
    async with statekeel.open_store(store_url, encryption_key=KEY) as store:
        await fill(store)
        await store.backup(tmp_path / "before.db")
        report = await store.erase(SUBJECT, actor="dpo", reason="request 113")
        assert report.counts == EXPECTED and report.data_keys == 0
        assert await store.sessions.load("chat-7") is None
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'before.db'}", encryption_key=KEY) as old:
        kept = await old.sessions.load("chat-7")
        assert kept is not None and [m["content"] for m in kept.messages] == ["chat-7 2", "chat-7 3"]


async def test_a_session_that_stopped_naming_the_subject_during_the_erasure_keeps_its_data_key(
    ringed: tuple[statekeel.Store, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = ringed
    await fill(store)
    real = store.backend.erase_sessions

    async def changed_first(subject: str, keys: Any, **kwargs: Any) -> Any:
        # Listed as the subject's, then given to someone else before its batch runs.
        session = await store.sessions.load("chat-7")
        assert session is not None
        session.metadata["subject"] = "carol"
        await store.sessions.save(session)
        return await real(subject, keys, **kwargs)

    monkeypatch.setattr(store.backend, "erase_sessions", changed_first)
    report = await store.erase(SUBJECT, actor="dpo", reason="request 113")
    monkeypatch.undo()
    assert report.sessions == 1 and report.data_keys == 1  # only "user:alice"'s
    store.sessions.evict("chat-7")
    kept = await store.backend.read_messages("chat-7", start=0)
    assert [m.payload["content"] for m in kept] == ["chat-7 2", "chat-7 3"]
    loaded = await store.sessions.load("chat-7")
    assert loaded is not None and loaded.metadata["subject"] == "carol" and len(loaded.messages) == 2


async def test_with_a_key_ring_the_forks_of_the_subjects_sessions_lose_their_data_keys_too(
    ringed: tuple[statekeel.Store, str], tmp_path: Path
) -> None:
    store, ring = ringed
    await fill(store)
    fork = await store.sessions.fork("chat-7", 3, new_key="chat-7-fork")
    fork.add_message("user", "the fork's own words")
    await store.sessions.save(fork)
    await store.backup(tmp_path / "before.db")
    report = await store.erase(SUBJECT, actor="dpo", reason="request 113")
    assert report.data_keys == 3  # "user:alice", "chat-7" and its fork
    async with statekeel.open_store(
        f"sqlite:///{tmp_path / 'before.db'}", encryption_key=KEY, keyring=ring
    ) as old:
        with pytest.raises(statekeel.SubjectErased):
            await old.backend.read_messages("chat-7-fork", start=3)


async def test_after_an_erasure_the_erasing_process_opens_nothing_under_the_destroyed_keys(
    ringed: tuple[statekeel.Store, str],
) -> None:
    store, _ = ringed
    await fill(store)
    cipher = store.codec.cipher
    assert cipher is not None and cipher.ring is not None
    ring = cipher.ring
    sealed = {key: orjson.loads(cipher.seal(b'"words"', "message", (key, 0))) for key in (SUBJECT, "chat-7")}
    kids = {key: cipher.stored_key_id(v, "message", (key, 0)) for key, v in sealed.items()}
    for key, kid in kids.items():  # opened once: the ring's cache holds the keys
        assert kid is not None and ring.opening_key(kid) is not None
        assert cipher.open_raw(sealed[key], "message", (key, 0)) == b'"words"'
    await store.erase(SUBJECT, actor="dpo", reason="request 113")
    for key, kid in kids.items():
        assert kid is not None
        assert ring.opening_key(kid) is None and not ring.holds(kid) and ring.destroyed(kid)
        with pytest.raises(statekeel.SubjectErased) as info:
            cipher.open_raw(sealed[key], "message", (key, 0))
        assert info.value.key_id == kid


async def test_a_fork_made_while_the_erasure_runs_loses_its_data_key_too(
    ringed: tuple[statekeel.Store, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, ring_path = ringed
    await fill(store)
    cipher = store.codec.cipher
    assert cipher is not None and cipher.ring is not None
    real = store.backend.erase_sessions
    made: dict[str, Any] = {}

    async def fork_first(subject: str, keys: Any, **kwargs: Any) -> Any:
        # Made after the erasure listed the subject's sessions, before their batch runs.
        if not made:
            fork = await store.sessions.fork("chat-7", 3, new_key="late-fork")
            fork.add_message("user", "the late fork's own words")
            await store.sessions.save(fork)
            made["sealed"] = orjson.loads(cipher.seal(b'"late"', "message", ("late-fork", 3)))
            made["kid"] = cipher.stored_key_id(made["sealed"], "message", ("late-fork", 3))
        return await real(subject, keys, **kwargs)

    monkeypatch.setattr(store.backend, "erase_sessions", fork_first)
    report = await store.erase(SUBJECT, actor="dpo", reason="request 113")
    monkeypatch.undo()
    assert report.sessions == 3 and "late-fork" in report.session_keys
    assert report.data_keys == 3  # "user:alice", "chat-7" and the late fork
    assert await store.sessions.load("late-fork") is None
    kid = made["kid"]
    assert cipher.ring.opening_key(kid) is None and cipher.ring.destroyed(kid)
    with pytest.raises(statekeel.SubjectErased):
        cipher.open_raw(made["sealed"], "message", ("late-fork", 3))
    # Gone from the ring file too, not only from this process's memory.
    other = await asyncio.to_thread(open_keyring, ring_path, KEY)
    try:
        assert other.opening_key(kid) is None and other.destroyed(kid)
    finally:
        other.close()
