"""store.memory: typed, scoped, versioned memories with their history, episodes, the graph in time,
contradictions and the buffered access log — on every backend."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import statekeel
from statekeel.memory import ACCESS_BATCH, ACCESS_BUFFER

Store = statekeel.Store

MEMORY_TABLES = (
    "memories",
    "memory_events",
    "memory_episodes",
    "memory_relations",
    "memory_contradictions",
    "memory_accesses",
)


async def row_counts(store: Store) -> dict[str, int]:
    return {t: await store.backend.count_rows(t) for t in MEMORY_TABLES}


def _ago(**kwargs: float) -> dt.datetime:
    return dt.datetime.now(dt.UTC) - dt.timedelta(**kwargs)


# --- put, history, versions -----------------------------------------------------------------------------


async def test_put_adds_a_memory_with_its_add_event(store: Store) -> None:
    m = await store.memory.put(
        "user",
        "drink",
        "tea",
        scope="user:42",
        data={"since": 2019},
        confidence=0.8,
        source="chat",
        actor="a7",
    )
    assert (m.type, m.scope, m.key, m.content, m.data) == ("user", "user:42", "drink", "tea", {"since": 2019})
    assert (m.confidence, m.source, m.version) == (0.8, "chat", 1)
    assert m.created_at == m.updated_at and m.deleted_at is None and m.superseded_by is None
    assert await store.memory.get(m.id) == m
    [event] = await store.memory.history(m.id)
    assert (event.event, event.old, event.new, event.actor, event.version) == ("ADD", None, "tea", "a7", 1)
    assert (
        event.before is None and event.after["confidence"] == 0.8 and event.after["data"] == {"since": 2019}
    )


async def test_put_with_a_live_key_updates_in_place_and_records_old_and_new(store: Store) -> None:
    first = await store.memory.put("user", "drink", "tea", scope="user:42")
    second = await store.memory.put(
        "user", "drink", "coffee", scope="user:42", confidence=0.6, actor="a7", reason="said so today"
    )
    assert second.id == first.id and second.version == 2 and second.content == "coffee"
    assert second.created_at == first.created_at and second.updated_at > first.updated_at
    events = await store.memory.history(first.id)
    assert [(e.event, e.old, e.new, e.version) for e in events] == [
        ("ADD", None, "tea", 1),
        ("UPDATE", "tea", "coffee", 2),
    ]
    assert (events[1].actor, events[1].reason) == ("a7", "said so today")
    assert events[1].before is not None
    assert (events[1].before["confidence"], events[1].after["confidence"]) == (1.0, 0.6)
    assert (await row_counts(store))["memories"] == 1


async def test_an_identical_put_changes_nothing(store: Store) -> None:
    content = {"b": [1, 2.5, "x"], "a": {"when": dt.datetime(2026, 1, 2, tzinfo=dt.UTC)}}
    first = await store.memory.put("semantic", "fact", content, data={"z": 1, "y": 2}, confidence=0.5)
    # Same values, other key order: JSONB reorders keys, the comparison must not care.
    again = await store.memory.put(
        "semantic", "fact", {"a": content["a"], "b": content["b"]}, data={"y": 2, "z": 1}, confidence=0.5
    )
    assert again == first
    assert len(await store.memory.history(first.id)) == 1
    # An int where a float was stored is a change, not the same value.
    changed = await store.memory.put("semantic", "fact", content, data={"z": 1.0, "y": 2}, confidence=0.5)
    assert changed.version == 2


async def test_every_field_that_differs_is_a_change(store: Store) -> None:
    base: dict[str, Any] = {"scope": "s", "data": None, "confidence": 1.0, "source": None, "expires_at": None}
    m = await store.memory.put("user", "k", "v", **base)
    for field, value in (
        ("data", {"x": 1}),
        ("confidence", 0.9),
        ("source", "doc"),
        ("expires_at", dt.datetime.now(dt.UTC) + dt.timedelta(days=1)),
    ):
        base[field] = value
        m = await store.memory.put("user", "k", "v", **base)
    assert m.version == 5
    assert [e.event for e in await store.memory.history(m.id)] == ["ADD"] + ["UPDATE"] * 4


async def test_put_without_a_key_always_adds(store: Store) -> None:
    a = await store.memory.put("episodic", None, "ran the tests")
    b = await store.memory.put("episodic", None, "ran the tests")
    assert a.id != b.id and a.key is None
    assert (await row_counts(store))["memories"] == 2


async def test_the_same_key_in_another_type_or_scope_is_another_memory(store: Store) -> None:
    ids = {
        (await store.memory.put("user", "lang", "en", scope="u1")).id,
        (await store.memory.put("user", "lang", "de", scope="u2")).id,
        (await store.memory.put("environment", "lang", "python", scope="u1")).id,
    }
    assert len(ids) == 3


async def test_concurrent_puts_of_one_key_leave_one_memory_with_every_change(store: Store) -> None:
    results = await asyncio.gather(
        *(store.memory.put("user", "counter", f"v{i}", scope="s") for i in range(20))
    )
    assert len({m.id for m in results}) == 1
    (memory,) = (await store.memory.query(scope="s")).items
    events = await store.memory.history(memory.id)
    assert [e.version for e in events] == list(range(1, 21)) and memory.version == 20
    assert [e.event for e in events] == ["ADD"] + ["UPDATE"] * 19
    # Every put applied once: each value appears once in the history, none lost, none applied twice.
    assert sorted(e.new for e in events) == sorted(f"v{i}" for i in range(20))


async def test_a_put_rolled_back_with_its_atomic_block_leaves_no_memory_and_no_event(store: Store) -> None:
    kept = await store.memory.put("user", "k", "before")
    with pytest.raises(RuntimeError):
        async with store.backend.atomic():
            await store.memory.put("user", "k", "inside")
            await store.memory.put("user", "other", "inside")
            raise RuntimeError("abort")
    assert await store.memory.get(kept.id) == kept
    assert await row_counts(store) == {**dict.fromkeys(MEMORY_TABLES, 0), "memories": 1, "memory_events": 1}


async def test_content_and_data_round_trip_exactly(store: Store) -> None:
    content = {
        "text": "naïve",
        "blob": b"\x00\x01",
        "at": dt.datetime(2026, 5, 1, 12, tzinfo=dt.UTC),
        "n": 2**70,
    }
    m = await store.memory.put("procedural", "how-to-build", content, data=[1, -0.0, 1e20])
    got = await store.memory.get(m.id)
    assert got is not None and got.content == content
    assert got.data == [1, -0.0, 1e20] and math.copysign(1.0, got.data[1]) == -1.0


# --- forget and supersede -------------------------------------------------------------------------------


async def test_forget_hides_a_memory_and_records_delete(store: Store) -> None:
    m = await store.memory.put("user", "drink", "tea")
    gone = await store.memory.forget(m.id, reason="user asked", actor="alice")
    assert gone.forgotten and gone.version == 2 and gone.deleted_at is not None
    assert await store.memory.get(m.id) is None
    assert await store.memory.get(m.id, include_forgotten=True) == gone
    assert (await store.memory.query()).items == []
    assert [x.id for x in (await store.memory.query(include_forgotten=True)).items] == [m.id]
    last = (await store.memory.history(m.id))[-1]
    assert (last.event, last.old, last.new, last.actor, last.reason) == (
        "DELETE",
        "tea",
        None,
        "alice",
        "user asked",
    )
    # Forgetting again changes nothing; a new put of the key starts a new memory.
    assert await store.memory.forget(m.id, reason="again", actor="alice") == gone
    assert len(await store.memory.history(m.id)) == 2
    fresh = await store.memory.put("user", "drink", "water")
    assert fresh.id != m.id and fresh.version == 1


async def test_supersede_replaces_a_memory_and_records_it(store: Store) -> None:
    old = await store.memory.put("semantic", "capital", "Bonn", scope="de")
    new = await store.memory.put("semantic", None, "Berlin", scope="de")
    replaced = await store.memory.supersede(old.id, new.id, reason="moved in 1990", actor="editor")
    assert replaced.superseded_by == new.id and replaced.version == 2
    assert [m.id for m in (await store.memory.query(scope="de")).items] == [new.id]
    both = await store.memory.query(scope="de", include_superseded=True)
    assert {m.id for m in both.items} == {old.id, new.id}
    event = (await store.memory.history(old.id))[-1]
    assert (event.event, event.reason, event.after["superseded_by"]) == ("SUPERSEDE", "moved in 1990", new.id)
    # A retried call changes nothing; superseding again by another memory is refused.
    assert await store.memory.supersede(old.id, new.id, reason="retry", actor="editor") == replaced
    other = await store.memory.put("semantic", None, "Berlin!", scope="de")
    with pytest.raises(statekeel.InvalidTransition, match="already superseded"):
        await store.memory.supersede(old.id, other.id, reason="r", actor="a")
    # The key is free again: a put adds a new live memory.
    assert (await store.memory.put("semantic", "capital", "Berlin", scope="de")).id not in {old.id, new.id}


async def test_a_forgotten_memory_takes_no_part_in_a_supersede(store: Store) -> None:
    a = await store.memory.put("user", None, "a")
    b = await store.memory.put("user", None, "b")
    await store.memory.forget(b.id, reason="wrong", actor="x")
    before = await row_counts(store)
    with pytest.raises(statekeel.InvalidTransition, match="forgotten"):
        await store.memory.supersede(a.id, b.id, reason="r", actor="x")
    assert await row_counts(store) == before


# --- query ----------------------------------------------------------------------------------------------


async def test_query_filters_by_type_scope_key_and_confidence(store: Store) -> None:
    await store.memory.put("user", "lang", "en", scope="u1", confidence=0.9)
    await store.memory.put("user", "tz", "UTC", scope="u1", confidence=0.4)
    await store.memory.put("user", "lang", "de", scope="u2", confidence=1.0)
    await store.memory.put("environment", "lang", "py", scope="u1", confidence=0.7)

    async def contents(**filters: Any) -> list[Any]:
        return [m.content for m in (await store.memory.query(**filters)).items]

    assert await contents() == ["py", "de", "UTC", "en"]
    assert await contents(type="user") == ["de", "UTC", "en"]
    assert await contents(scope="u1") == ["py", "UTC", "en"]
    assert await contents(type="user", scope="u1") == ["UTC", "en"]
    assert await contents(key="lang") == ["py", "de", "en"]
    assert await contents(type="user", key="lang", scope="u2") == ["de"]
    assert await contents(min_confidence=0.7) == ["py", "de", "en"]
    assert await contents(scope="u1", min_confidence=0.8) == ["en"]


async def test_query_is_newest_change_first_and_pages_with_a_cursor(store: Store) -> None:
    for i in range(25):
        await store.memory.put("semantic", f"k{i:02d}", i, scope="p")
    await store.memory.put("semantic", "k03", "updated", scope="p")
    seen: list[Any] = []
    cursor = None
    pages = 0
    while True:
        page = await store.memory.query(scope="p", limit=10, cursor=cursor)
        seen += [m.content for m in page.items]
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert pages == 3
    assert seen == ["updated", *[i for i in range(24, -1, -1) if i != 3]]


async def test_expired_memories_are_left_out_unless_asked(store: Store) -> None:
    stale = await store.memory.put("environment", "cwd", "/tmp", expires_at=_ago(seconds=1))
    live = await store.memory.put("environment", "os", "linux", expires_at=_ago(days=-1))
    assert [m.id for m in (await store.memory.query()).items] == [live.id]
    assert {m.id for m in (await store.memory.query(include_expired=True)).items} == {stale.id, live.id}
    got = await store.memory.get(stale.id)
    assert got is not None and got.expired() and not live.expired()


# --- by scope prefix --------------------------------------------------------------------------------------

# Scopes around the prefix "a/b": equal to it, under it, beside it ("a/bc" starts with it too), before and
# after it in code point order, and scopes of characters at the edges of Unicode.
PREFIX_SCOPES = ("a/", "a/a", "a/b", "a/b/c", "a/bc", "a/b\U0010ffff", "a/c", "a0", "b", "é/x", "éa", "ê")


async def _scoped(store: Store, scopes: tuple[str, ...]) -> None:
    for scope in scopes:
        await store.memory.put("semantic", "k", scope, scope=scope)


async def test_query_by_scope_prefix_keeps_exactly_the_scopes_that_start_with_it(store: Store) -> None:
    await _scoped(store, PREFIX_SCOPES)

    async def scopes(prefix: str, **filters: Any) -> set[str]:
        return {m.scope for m in (await store.memory.query(scope_prefix=prefix, **filters)).items}

    assert await scopes("a/b") == {"a/b", "a/b/c", "a/bc", "a/b\U0010ffff"}
    assert await scopes("a/b/") == {"a/b/c"}
    assert await scopes("a/b/c") == {"a/b/c"}
    assert await scopes("a/b\U0010ffff") == {"a/b\U0010ffff"}
    assert await scopes("a/") == {s for s in PREFIX_SCOPES if s.startswith("a/")}
    assert await scopes("é") == {"é/x", "éa"}
    assert await scopes("\U0010ffff") == set()
    assert await scopes("z") == set()
    assert await scopes("a/b", type="semantic") == {"a/b", "a/b/c", "a/bc", "a/b\U0010ffff"}
    assert await scopes("a/b", type="user") == set()
    assert [m.scope for m in (await store.memory.query(scope_prefix="a/b", key="k")).items] == [
        "a/b\U0010ffff",
        "a/bc",
        "a/b/c",
        "a/b",
    ]


async def test_a_prefix_of_the_last_code_point_reaches_every_scope_under_it(store: Store) -> None:
    top = "\U0010ffff"
    await _scoped(store, (top, top * 2, top + "a", "\U0010fffe", "\ud7ff", "\ue000"))
    assert {m.scope for m in (await store.memory.query(scope_prefix=top)).items} == {top, top * 2, top + "a"}
    # The character after U+D7FF is U+E000 (surrogates are not text): the bound skips them.
    assert {m.scope for m in (await store.memory.query(scope_prefix="\ud7ff")).items} == {"\ud7ff"}
    assert (await store.memory.scopes(top)).items == [top, top + "a", top * 2]


async def test_query_by_scope_prefix_is_newest_first_and_pages_with_a_cursor(store: Store) -> None:
    for i in range(25):
        await store.memory.put("semantic", f"k{i:02d}", i, scope=f"p/{i % 3}")
        await store.memory.put("semantic", f"k{i:02d}", -i, scope=f"q/{i % 3}")
    await store.memory.put("semantic", "k03", "updated", scope="p/0")
    seen: list[Any] = []
    cursor = None
    pages = 0
    while True:
        page = await store.memory.query(scope_prefix="p/", limit=10, cursor=cursor)
        seen += [m.content for m in page.items]
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert pages == 3
    assert seen == ["updated", *[i for i in range(24, -1, -1) if i != 3]]


async def test_forgotten_superseded_and_expired_memories_are_left_out_of_a_prefix_unless_asked(
    store: Store,
) -> None:
    live = await store.memory.put("user", "live", 1, scope="t/live")
    forgotten = await store.memory.put("user", "gone", 2, scope="t/forgotten")
    await store.memory.forget(forgotten.id, reason="r", actor=None)
    old = await store.memory.put("user", "old", 3, scope="t/superseded")
    new = await store.memory.put("user", "new", 4, scope="t/superseded")
    await store.memory.supersede(old.id, new.id, reason="r", actor=None)
    stale = await store.memory.put("user", "stale", 5, scope="t/expired", expires_at=_ago(seconds=1))

    async def ids(**flags: Any) -> set[str]:
        return {m.id for m in (await store.memory.query(scope_prefix="t/", **flags)).items}

    assert await ids() == {live.id, new.id}
    assert await ids(include_forgotten=True) == {live.id, new.id, forgotten.id}
    assert await ids(include_superseded=True) == {live.id, new.id, old.id}
    assert await ids(include_expired=True) == {live.id, new.id, stale.id}
    # A scope is listed while it holds a live memory.
    assert (await store.memory.scopes("t/")).items == ["t/live", "t/superseded"]


async def test_scopes_lists_each_scope_under_a_prefix_once_in_code_point_order(store: Store) -> None:
    await _scoped(store, PREFIX_SCOPES)
    await store.memory.put("semantic", "k2", "again", scope="a/b")
    await store.memory.put("user", "k", "other type", scope="a/bd")
    assert (await store.memory.scopes("a/b")).items == ["a/b", "a/b/c", "a/bc", "a/bd", "a/b\U0010ffff"]
    assert (await store.memory.scopes("a/b", type="semantic")).items == [
        "a/b",
        "a/b/c",
        "a/bc",
        "a/b\U0010ffff",
    ]
    assert (await store.memory.scopes("a/b", type="user")).items == ["a/bd"]
    assert (await store.memory.scopes("é")).items == ["é/x", "éa"]
    assert (await store.memory.scopes()).items == sorted([*PREFIX_SCOPES, "a/bd"])
    assert (await store.memory.scopes("zz")).items == []


async def test_scopes_pages_with_a_cursor(store: Store) -> None:
    names = tuple(f"n/{i:02d}" for i in range(23))
    await _scoped(store, (*names, "m", "o"))
    for scope in names[:5]:
        await store.memory.put("semantic", "k2", "second memory of the scope", scope=scope)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = await store.memory.scopes("n/", limit=10, cursor=cursor)
        seen += page.items
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert (pages, seen) == (3, list(names))
    last = await store.memory.scopes("n/", limit=23)
    assert (last.items, last.next_cursor) == (list(names), None)


async def test_changed_lists_every_change_since_a_time_oldest_first(store: Store) -> None:
    a = await store.memory.put("user", "a", 1)
    mark = dt.datetime.now(dt.UTC)
    b = await store.memory.put("user", "b", 2)
    await store.memory.forget(a.id, reason="r", actor="x")
    page = await store.memory.changed(since=mark, limit=1)
    assert [m.id for m in page.items] == [b.id]
    assert page.next_cursor is not None
    rest = await store.memory.changed(since=mark, cursor=page.next_cursor)
    assert [(m.id, m.version, m.forgotten) for m in rest.items] == [(a.id, 2, True)]
    assert rest.next_cursor is None


# --- episodes -------------------------------------------------------------------------------------------


async def test_episodes_are_listed_by_session_newest_first(store: Store) -> None:
    e1 = await store.memory.add_episode(
        "s1", "fixed the failing test", first_seq=0, upto_seq=12, entities=["tests"]
    )
    e2 = await store.memory.add_episode("s2", "deployed", importance=0.9)
    e3 = await store.memory.add_episode(
        "s1", "wrote docs", first_seq=12, upto_seq=30, entities=("docs", "README")
    )
    assert await store.memory.episodes("s1") == [e3, e1]
    assert [e.id for e in await store.memory.episodes()] == [e3.id, e2.id, e1.id]
    assert await store.memory.episodes(limit=1) == [e3]
    assert (e3.entities, e3.first_seq, e3.upto_seq, e3.importance) == (("docs", "README"), 12, 30, 0.5)


@pytest.mark.kinds("store")  # rewinds need sessions in a SQL store
async def test_an_episode_names_its_seqs_under_the_rewind_count_they_were_taken_in(store: Store) -> None:
    s = await store.sessions.get_or_create("s")
    for text in ("ask", "first answer", "follow-up"):
        s.add_message("user", text)
    await store.sessions.save(s)
    before = await store.memory.add_episode("s", "the first answer", first_seq=1, upto_seq=2)
    rw = await store.sessions.rewind("s", 1, reason="answer again")
    s.add_message("assistant", "second answer")
    await store.sessions.save(s)
    after = await store.memory.add_episode("s", "the second answer", first_seq=1, upto_seq=1)
    assert (before.rewinds, after.rewinds) == (0, 1)
    assert {e.id: e.rewinds for e in await store.memory.episodes("s")} == {before.id: 0, after.id: 1}
    # Seq 1 under count 0 is the rewound "first answer" (the first rewind after count 0 holds it); under
    # count 1 it is the live "second answer".
    [first_rewind] = (await store.sessions.rewinds("s"))[before.rewinds :]
    assert first_rewind == rw and rw.to_seq <= 1
    rewound = await store.sessions.archived("s", rw.compression_id)
    assert [(a.seq, a.payload["content"]) for a in rewound] == [(1, "first answer"), (2, "follow-up")]
    assert (await store.backend.read_messages("s", start=1, end=2))[0].payload["content"] == "second answer"


# --- the graph in time ----------------------------------------------------------------------------------


async def test_relations_answer_what_was_true_at_a_time(store: Store) -> None:
    t0 = _ago(days=30)
    job = await store.memory.relate("alice", "works_at", "acme", valid_from=t0)
    await store.memory.relate("alice", "lives_in", "paris", valid_from=t0)
    t1 = _ago(days=10)
    ended = await store.memory.unrelate(job.id, at=t1)
    assert ended.valid_to == t1
    new_job = await store.memory.relate("alice", "works_at", "globex", valid_from=t1)

    def names(edges: list[statekeel.Relation]) -> list[tuple[str, str]]:
        return sorted((e.relation, e.obj) for e in edges)

    assert names(await store.memory.relations("alice")) == [("lives_in", "paris"), ("works_at", "globex")]
    assert names(await store.memory.relations("alice", at=_ago(days=20))) == [
        ("lives_in", "paris"),
        ("works_at", "acme"),
    ]
    assert await store.memory.relations("alice", at=_ago(days=40)) == []
    assert [e.id for e in await store.memory.relations("alice", relation="works_at")] == [new_job.id]
    # Seen from the object's side too; and nothing was deleted.
    assert [e.subject for e in await store.memory.relations("acme", at=_ago(days=20))] == ["alice"]
    assert (await row_counts(store))["memory_relations"] == 3


async def test_an_edge_traces_back_to_the_memory_that_produced_it(store: Store) -> None:
    m = await store.memory.put("semantic", None, "Alice joined Acme in March")
    edge = await store.memory.relate("alice", "works_at", "acme", weight=0.7, source_memory_id=m.id)
    [found] = await store.memory.relations("acme")
    assert found == edge and found.source_memory_id == m.id and found.weight == 0.7
    source = await store.memory.get(found.source_memory_id)
    assert source is not None and source.content == "Alice joined Acme in March"


async def test_unrelate_ends_an_edge_once(store: Store) -> None:
    edge = await store.memory.relate("a", "knows", "b")
    await store.memory.unrelate(edge.id)
    with pytest.raises(statekeel.InvalidTransition, match="already ended"):
        await store.memory.unrelate(edge.id)
    with pytest.raises(statekeel.NotFound):
        await store.memory.unrelate("no-such-relation")


# --- contradictions -------------------------------------------------------------------------------------


async def test_contradictions_are_listed_until_resolved_once(store: Store) -> None:
    a = await store.memory.put("user", "diet", "vegan")
    b = await store.memory.put("user", None, "ordered a steak")
    c = await store.memory.record_contradiction(a.id, b.id, "diet vs. order")
    assert not c.resolved and await store.memory.open_contradictions() == [c]
    done = await store.memory.resolve_contradiction(c.id, "vegetarian since May")
    assert done.resolved and done.resolution == "vegetarian since May" and done.resolved_at is not None
    assert await store.memory.open_contradictions() == []
    with pytest.raises(statekeel.ConflictError, match="already resolved"):
        await store.memory.resolve_contradiction(c.id, "something else")
    with pytest.raises(statekeel.NotFound):
        await store.memory.resolve_contradiction("no-such-contradiction", "x")


async def test_an_unresolved_contradiction_is_never_deleted(store: Store) -> None:
    a = await store.memory.put("user", None, "a")
    b = await store.memory.put("user", None, "b")
    c = await store.memory.record_contradiction(a.id, b.id, "a or b")
    with pytest.raises(statekeel.StatekeelError):
        await store.backend.clear_rows("memory_contradictions")
    with pytest.raises(statekeel.StatekeelError):
        await store.backend.clear_rows("memories")  # its memories go neither
    assert await store.memory.open_contradictions() == [c]
    assert (await row_counts(store))["memories"] == 2
    await store.memory.resolve_contradiction(c.id, "b")
    assert await store.backend.clear_rows("memory_contradictions") == 1


# --- the access log (buffered) ---------------------------------------------------------------------------


async def test_accesses_are_written_by_flush_newest_first(store: Store) -> None:
    m = await store.memory.put("user", "k", "v")
    assert store.memory.record_access(m.id, "what does the user drink?") is None
    store.memory.record_access(m.id)
    assert store.memory.accesses_pending == 2
    await store.memory.flush()
    assert store.memory.accesses_pending == 0
    assert await store.backend.count_rows("memory_accesses") == 2
    got = await store.memory.accesses(m.id)
    assert [a.context_query for a in got] == [None, "what does the user drink?"]
    assert got[0].at > got[1].at
    assert await store.memory.accesses(m.id, limit=1) == got[:1]


async def test_accesses_reads_what_this_process_recorded(store: Store) -> None:
    m = await store.memory.put("user", "k", "v")
    store.memory.record_access(m.id, "q")
    assert [a.context_query for a in await store.memory.accesses(m.id)] == ["q"]


async def test_the_access_log_is_written_in_the_background(store: Store) -> None:
    m = await store.memory.put("user", "k", "v")
    for _ in range(ACCESS_BATCH):
        store.memory.record_access(m.id)
    # A full batch wakes the background writer at once: yield until it has written it.
    for _ in range(100_000):
        if store.memory.accesses_pending == 0:
            break
        await asyncio.sleep(0)
    assert store.memory.accesses_pending == 0
    assert await store.backend.count_rows("memory_accesses") == ACCESS_BATCH


async def test_the_background_writer_never_joins_the_callers_atomic_block(store: Store) -> None:
    m = await store.memory.put("user", "k", "v")
    with pytest.raises(RuntimeError):
        async with store.backend.atomic():
            for _ in range(ACCESS_BATCH):
                store.memory.record_access(m.id)  # never waits, even while this block holds the writer
            # A full batch: the background writer starts its write during the block. Had it joined the
            # block, the rollback below would take the accesses with it.
            for _ in range(100):
                await asyncio.sleep(0)
            with pytest.raises(statekeel.InvalidArgument, match="inside atomic"):
                await store.memory.flush()
            raise RuntimeError("roll the block back")
    await store.memory.flush()
    assert await store.backend.count_rows("memory_accesses") == ACCESS_BATCH


async def test_a_full_access_buffer_drops_the_oldest_entries_and_counts_them(store: Store) -> None:
    m = await store.memory.put("user", "k", "v")
    # No await in between: the background writer cannot run, the buffer fills up.
    for i in range(ACCESS_BUFFER + 5):
        store.memory.record_access(m.id, f"q{i}")
    assert store.memory.accesses_dropped == 5
    assert store.memory.accesses_pending == ACCESS_BUFFER
    await store.memory.flush()
    got = await store.memory.accesses(m.id, limit=20_000)
    assert len(got) == ACCESS_BUFFER
    assert {a.context_query for a in got} == {f"q{i}" for i in range(5, ACCESS_BUFFER + 5)}


async def test_close_writes_the_buffered_access_log(store_url: str, tmp_path: Any) -> None:
    if store_url == "memory://":
        pytest.skip("an in-memory store cannot be opened again")
    async with statekeel.open_store(store_url) as store:
        m = await store.memory.put("user", "k", "v")
        store.memory.record_access(m.id, "q")
    async with statekeel.open_store(store_url) as store:
        assert [a.context_query for a in await store.backend.list_accesses(m.id)] == ["q"]
        await store.close()
        store.memory.record_access(m.id)  # after close: dropped and counted, never raised
        assert store.memory.accesses_dropped == 1


# --- bad input: a typed error before anything is written, on every backend --------------------------------

BadCall = Callable[[Store, dict[str, str]], Awaitable[object]]

BAD_INPUT: list[tuple[str, type[statekeel.StatekeelError], BadCall]] = [
    ("unknown-type", statekeel.InvalidArgument, lambda s, ids: s.memory.put("opinion", "k", "v")),
    ("type-not-text", statekeel.InvalidArgument, lambda s, ids: s.memory.put(1, "k", "v")),  # type: ignore[arg-type]
    (
        "confidence-above-1",
        statekeel.InvalidArgument,
        lambda s, ids: s.memory.put("user", "k", "v", confidence=1.5),
    ),
    (
        "confidence-negative",
        statekeel.InvalidArgument,
        lambda s, ids: s.memory.put("user", "k", "v", confidence=-0.1),
    ),
    (
        "confidence-nan",
        statekeel.InvalidArgument,
        lambda s, ids: s.memory.put("user", "k", "v", confidence=float("nan")),
    ),
    (
        "confidence-not-a-number",
        statekeel.InvalidArgument,
        lambda s, ids: s.memory.put("user", "k", "v", confidence="high"),  # type: ignore[arg-type]
    ),
    ("empty-key", statekeel.InvalidKey, lambda s, ids: s.memory.put("user", "", "v")),
    ("key-not-text", statekeel.InvalidKey, lambda s, ids: s.memory.put("user", 42, "v")),  # type: ignore[arg-type]
    ("empty-scope", statekeel.InvalidKey, lambda s, ids: s.memory.put("user", "k", "v", scope="")),
    ("scope-not-text", statekeel.InvalidKey, lambda s, ids: s.memory.put("user", "k", "v", scope=b"s")),  # type: ignore[arg-type]
    (
        "content-unstorable",
        statekeel.SerializationError,
        lambda s, ids: s.memory.put("user", "k", {"x": object()}),
    ),
    ("content-nan", statekeel.SerializationError, lambda s, ids: s.memory.put("user", "k", float("nan"))),
    ("content-none", statekeel.InvalidArgument, lambda s, ids: s.memory.put("user", "k", None)),
    (
        "data-unstorable",
        statekeel.SerializationError,
        lambda s, ids: s.memory.put("user", "k", "v", data={1, 2}),
    ),
    (
        "expires-naive",
        statekeel.InvalidArgument,
        lambda s, ids: s.memory.put("user", "k", "v", expires_at=dt.datetime(2030, 1, 1)),
    ),
    (
        "update-unstorable",
        statekeel.SerializationError,
        lambda s, ids: s.memory.put("user", "existing", {"f": lambda: 1}),
    ),
    (
        "forget-unknown",
        statekeel.NotFound,
        lambda s, ids: s.memory.forget("no-such-id", reason="r", actor="a"),
    ),
    ("forget-not-text", statekeel.InvalidKey, lambda s, ids: s.memory.forget(7, reason="r", actor="a")),  # type: ignore[arg-type]
    (
        "supersede-unknown-old",
        statekeel.NotFound,
        lambda s, ids: s.memory.supersede("no-such-id", ids["a"], reason="r", actor="a"),
    ),
    (
        "supersede-unknown-new",
        statekeel.NotFound,
        lambda s, ids: s.memory.supersede(ids["a"], "no-such-id", reason="r", actor="a"),
    ),
    (
        "supersede-itself",
        statekeel.InvalidArgument,
        lambda s, ids: s.memory.supersede(ids["a"], ids["a"], reason="r", actor="a"),
    ),
    ("history-unknown", statekeel.NotFound, lambda s, ids: s.memory.history("no-such-id")),
    (
        "resolve-resolved",
        statekeel.ConflictError,
        lambda s, ids: s.memory.resolve_contradiction(ids["resolved"], "again"),
    ),
    ("resolve-unknown", statekeel.NotFound, lambda s, ids: s.memory.resolve_contradiction("nope", "x")),
    (
        "resolve-empty-text",
        statekeel.InvalidArgument,
        lambda s, ids: s.memory.resolve_contradiction(ids["open"], ""),
    ),
    (
        "contradiction-unknown-memory",
        statekeel.NotFound,
        lambda s, ids: s.memory.record_contradiction(ids["a"], "no-such-id", "x"),
    ),
    (
        "contradiction-self",
        statekeel.InvalidArgument,
        lambda s, ids: s.memory.record_contradiction(ids["a"], ids["a"], "x"),
    ),
    (
        "relation-ends-before-it-starts",
        statekeel.InvalidArgument,
        lambda s, ids: s.memory.relate("a", "r", "b", valid_from=_ago(days=1), valid_to=_ago(days=2)),
    ),
    (
        "unrelate-before-it-starts",
        statekeel.InvalidArgument,
        lambda s, ids: s.memory.unrelate(ids["edge"], at=_ago(days=400)),
    ),
    ("unrelate-unknown", statekeel.NotFound, lambda s, ids: s.memory.unrelate("no-such-relation")),
    ("relate-empty-entity", statekeel.InvalidKey, lambda s, ids: s.memory.relate("", "r", "b")),
    (
        "relate-nan-weight",
        statekeel.InvalidArgument,
        lambda s, ids: s.memory.relate("a", "r", "b", weight=float("nan")),
    ),
    (
        "relate-unknown-source",
        statekeel.NotFound,
        lambda s, ids: s.memory.relate("a", "r", "b", source_memory_id="no-such-id"),
    ),
    ("episode-empty-session", statekeel.InvalidKey, lambda s, ids: s.memory.add_episode("", "summary")),
    ("episode-empty-summary", statekeel.InvalidArgument, lambda s, ids: s.memory.add_episode("s", "")),
    (
        "episode-importance",
        statekeel.InvalidArgument,
        lambda s, ids: s.memory.add_episode("s", "x", importance=2),
    ),
    (
        "episode-range-backwards",
        statekeel.InvalidArgument,
        lambda s, ids: s.memory.add_episode("s", "x", first_seq=5, upto_seq=2),
    ),
    (
        "episode-entities-str",
        statekeel.InvalidArgument,
        lambda s, ids: s.memory.add_episode("s", "x", entities="abc"),
    ),
    ("query-unknown-type", statekeel.InvalidArgument, lambda s, ids: s.memory.query(type="opinion")),
    ("query-empty-prefix", statekeel.InvalidKey, lambda s, ids: s.memory.query(scope_prefix="")),
    ("query-prefix-not-text", statekeel.InvalidKey, lambda s, ids: s.memory.query(scope_prefix=1)),  # type: ignore[arg-type]
    (
        "query-scope-and-prefix",
        statekeel.InvalidArgument,
        lambda s, ids: s.memory.query(scope="a", scope_prefix="a"),
    ),
    ("scopes-empty-prefix", statekeel.InvalidKey, lambda s, ids: s.memory.scopes("")),
    ("scopes-nul-prefix", statekeel.InvalidKey, lambda s, ids: s.memory.scopes("a\x00")),
    ("scopes-limit-zero", statekeel.InvalidArgument, lambda s, ids: s.memory.scopes(limit=0)),
    ("scopes-limit-bool", statekeel.InvalidArgument, lambda s, ids: s.memory.scopes(limit=True)),
    ("scopes-unknown-type", statekeel.InvalidArgument, lambda s, ids: s.memory.scopes(type="opinion")),
    ("scopes-bad-cursor", statekeel.InvalidArgument, lambda s, ids: s.memory.scopes(cursor="nope")),
    ("query-bad-cursor", statekeel.InvalidArgument, lambda s, ids: s.memory.query(cursor="not-a-cursor")),
    (
        "query-min-confidence",
        statekeel.InvalidArgument,
        lambda s, ids: s.memory.query(min_confidence=float("nan")),
    ),
]


async def _fixtures(store: Store) -> dict[str, str]:
    a = await store.memory.put("user", "existing", "v")
    b = await store.memory.put("user", None, "w")
    resolved = await store.memory.record_contradiction(a.id, b.id, "x")
    await store.memory.resolve_contradiction(resolved.id, "settled")
    opened = await store.memory.record_contradiction(a.id, b.id, "y")
    edge = await store.memory.relate("a", "r", "b", valid_from=_ago(days=1))
    store.memory.record_access(a.id)
    await store.memory.flush()
    return {"a": a.id, "b": b.id, "resolved": resolved.id, "open": opened.id, "edge": edge.id}


@pytest.mark.parametrize(
    ("call", "error"), [(c, e) for _, e, c in BAD_INPUT], ids=[n for n, _, _ in BAD_INPUT]
)
async def test_bad_memory_input_is_a_typed_error_and_writes_nothing(
    store: Store, call: BadCall, error: type[statekeel.StatekeelError]
) -> None:
    ids = await _fixtures(store)
    before = await row_counts(store)
    history = await store.memory.history(ids["a"])
    with pytest.raises(error):
        await call(store, ids)
    assert await row_counts(store) == before
    assert await store.memory.history(ids["a"]) == history
    [still_open] = await store.memory.open_contradictions()
    assert still_open.id == ids["open"]
    # The store stays usable.
    assert (await store.memory.put("user", "after", "ok")).version == 1


async def test_record_access_refuses_a_bad_id_at_once(store: Store) -> None:
    for bad in ("", None, 5):
        with pytest.raises(statekeel.InvalidKey):
            store.memory.record_access(bad)  # type: ignore[arg-type]
    with pytest.raises(statekeel.InvalidArgument):
        store.memory.record_access("m", "\x00")
    assert store.memory.accesses_pending == 0
