"""SessionManager on every backend: round trips, delta saves, conflicts, lifecycle, listing, compression,
the cache, sessions deleted and created again under one key, and bad input."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

import statekeel
from lost_reply import lose_the_next_reply
from statekeel.backends.base import NewMessage
from statekeel.sessions import Session, SessionManager

pytestmark = pytest.mark.kinds("sessions", "tool_calls")


async def stored(store: statekeel.Store, key: str) -> list[dict[str, Any]]:
    """Every message of a session as the backend holds it (archive included), in seq order."""
    found = await store.backend.load_session_with_messages(key, include_archived=True)
    assert found is not None
    record, rows = found
    assert [r.seq for r in rows] == list(range(record.head_seq))  # dense
    return [r.payload for r in rows]


async def stored_contents(store: statekeel.Store, key: str) -> list[Any]:
    """The ``content`` of every message of a session as the backend holds it (archive included)."""
    return [payload["content"] for payload in await stored(store, key)]


async def test_round_trip_of_messages_and_metadata(store: statekeel.Store) -> None:
    sm = store.sessions
    s = await sm.get_or_create("user-42")
    s.metadata["title"] = "fix the build"
    s.metadata["at"] = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
    s.add_message("user", "run the tests")
    s.add_message("assistant", None, tool_calls=[{"id": "c1", "name": "pytest"}])
    s.add_message("tool", {"passed": 3, "cost": Decimal("0.25"), "blob": b"\x00\x01"}, tool_call_id="c1")
    await sm.save(s)
    other = statekeel.SessionManager(store.backend, store.codec)  # no cache: reads the backend
    again = await other.load("user-42")
    assert again is not None
    assert again.messages == s.messages
    assert again.metadata == s.metadata
    assert (again.status, again.last_consolidated, again.head_seq) == ("active", 0, 3)


async def test_save_writes_only_new_messages_and_nothing_when_unchanged(store: statekeel.Store) -> None:
    sm = store.sessions
    s = await sm.get_or_create("s")
    s.add_message("user", "a")
    await sm.save(s)
    version = (await store.backend.load_session("s")).version  # type: ignore[union-attr]
    await sm.save(s)  # nothing changed: no write
    assert (await store.backend.load_session("s")).version == version  # type: ignore[union-attr]
    s.add_message("assistant", "b")
    await sm.save(s)
    assert await stored(store, "s") == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
    ]


async def test_concurrent_writer_makes_save_raise_conflict_and_nothing_interleaves(
    store: statekeel.Store,
) -> None:
    first = store.sessions
    second = statekeel.SessionManager(store.backend, store.codec)
    a = await first.get_or_create("s")
    a.add_message("user", "base")
    await first.save(a)
    b = await second.load("s")
    assert b is not None
    b.add_message("user", "from b")
    await second.save(b)
    a.add_message("user", "from a")
    with pytest.raises(statekeel.ConflictError) as info:
        await first.save(a)
    assert info.value.current == 2
    assert [m["content"] for m in await stored(store, "s")] == ["base", "from b"]


async def test_metadata_and_status_changes_are_saved(store: statekeel.Store) -> None:
    sm = store.sessions
    s = await sm.get_or_create("s")
    await sm.save(s)
    s.metadata = {"k": 1}
    s.status = "archived"
    await sm.save(s)
    rec = await store.backend.load_session("s")
    assert rec is not None and rec.metadata == {"k": 1} and rec.status == "archived"


async def test_load_of_a_missing_session_is_none_and_get_or_create_writes_nothing(
    store: statekeel.Store,
) -> None:
    assert await store.sessions.load("nope") is None
    s = await store.sessions.get_or_create("nope")
    assert s.messages == [] and s.status == "active"
    assert await store.backend.load_session("nope") is None


async def test_get_or_create_sets_a_new_sessions_metadata_and_erase_finds_it_by_its_subject(
    store: statekeel.Store,
) -> None:
    first = {"subject": "user-7", "tags": ["a"]}
    s = await store.sessions.get_or_create("chat", metadata=first)
    first["tags"].append("changed by the caller")  # the session holds its own copy
    assert s.metadata == {"subject": "user-7", "tags": ["a"]}
    s.add_message("user", "hello")
    await store.sessions.save(s)
    # An existing session keeps its metadata, in this process and in another.
    again = await store.sessions.get_or_create("chat", metadata={"subject": "someone else"})
    assert again.metadata["subject"] == "user-7"
    other = statekeel.SessionManager(store.backend, store.codec)
    assert (await other.get_or_create("chat", metadata={"subject": "x"})).metadata["subject"] == "user-7"
    if store.holds("erasure"):
        report = await store.erase("user-7", actor="dpo", reason="request")
        assert report.counts["sessions"] == 1
        assert await store.sessions.load("chat") is None


@pytest.mark.parametrize("metadata", [["subject"], {1: "x"}, {"f": object()}, "subject=u"])
async def test_get_or_create_refuses_bad_metadata_before_anything_is_read_or_written(
    store: statekeel.Store, metadata: Any
) -> None:
    with pytest.raises((statekeel.InvalidArgument, statekeel.SerializationError)):
        await store.sessions.get_or_create("chat", metadata=metadata)
    assert await store.backend.load_session("chat") is None
    assert (await store.sessions.get_or_create("chat")).metadata == {}


# --- bad input ---------------------------------------------------------------------------------------

BAD_KEYS: list[Any] = ["", "a\x00b", "x" * 513, 42, None, b"key"]


@pytest.mark.parametrize("key", BAD_KEYS)
async def test_invalid_keys_are_refused_everywhere(store: statekeel.Store, key: Any) -> None:
    sm = store.sessions
    for call in (
        lambda: sm.load(key),
        lambda: sm.get_or_create(key),
        lambda: sm.expire(key),
        lambda: sm.delete(key),
        lambda: sm.compress(key, 1, "s"),
        lambda: sm.archived(key),
    ):
        with pytest.raises(statekeel.InvalidKey):
            await call()
    with pytest.raises(statekeel.InvalidKey):
        sm.lock(key)
    with pytest.raises(statekeel.InvalidKey):
        async with sm.open(key):
            pass
    assert (await sm.list()).items == []


async def test_message_that_is_not_a_dict_or_has_a_bad_role_is_refused_before_writing(
    store: statekeel.Store,
) -> None:
    sm = store.sessions
    s = await sm.get_or_create("s")
    s.add_message("user", "kept")
    await sm.save(s)
    for bad in ("just text", {"content": "no role"}, {"role": "", "content": "x"}, {"role": 7}):
        s.messages.append(bad)  # type: ignore[arg-type]
        s.add_message("user", "after the bad one")
        with pytest.raises(statekeel.InvalidArgument):
            await sm.save(s)
        del s.messages[1:]
    assert [m["content"] for m in await stored(store, "s")] == ["kept"]
    s.add_message("user", "store still usable")
    await sm.save(s)
    assert len(await stored(store, "s")) == 2


async def test_removing_saved_messages_is_refused(store: statekeel.Store) -> None:
    sm = store.sessions
    s = await sm.get_or_create("s")
    s.add_message("user", "a")
    s.add_message("user", "b")
    await sm.save(s)
    s.messages.pop()
    with pytest.raises(statekeel.InvalidArgument):
        await sm.save(s)


async def test_saving_a_session_of_another_store_is_refused(store: statekeel.Store) -> None:
    async with statekeel.open_store("memory://") as other:
        foreign = await other.sessions.get_or_create("s")
        foreign.add_message("user", "x")
        with pytest.raises(statekeel.InvalidArgument):
            await store.sessions.save(foreign)
    with pytest.raises(statekeel.InvalidArgument):
        await store.sessions.save("not a session")  # type: ignore[arg-type]
    assert await store.backend.load_session("s") is None


async def test_bad_status_and_list_arguments_are_refused(store: statekeel.Store) -> None:
    sm = store.sessions
    s = await sm.get_or_create("s")
    s.status = "paused"
    with pytest.raises(statekeel.InvalidArgument):
        await sm.save(s)
    assert await store.backend.load_session("s") is None
    for kwargs in ({"status": "paused"}, {"limit": 0}, {"limit": 10_001}, {"cursor": 3}, {"cursor": "zz"}):
        with pytest.raises(statekeel.InvalidArgument):
            await sm.list(**kwargs)


# --- lifecycle -----------------------------------------------------------------------------------------


async def saved(store: statekeel.Store, key: str, n: int = 1) -> Session:
    s = await store.sessions.get_or_create(key)
    for i in range(n):
        s.add_message("user", f"{key}-{i}")
    await store.sessions.save(s)
    return s


async def test_expire_archive_reopen_follow_the_legal_transitions(store: statekeel.Store) -> None:
    sm = store.sessions
    s = await saved(store, "s")
    assert (await sm.expire("s")).status == "expired"
    assert s.status == "expired"  # the cached session follows
    assert (await sm.archive("s")).status == "archived"
    version = (await store.backend.load_session("s")).version  # type: ignore[union-attr]
    with pytest.raises(statekeel.InvalidTransition):
        await sm.expire("s")  # archived -> expired is not a transition
    assert (await store.backend.load_session("s")).version == version  # type: ignore[union-attr]
    assert (await sm.reopen("s")).status == "active"
    assert (await sm.reopen("s")).status == "active"  # already there: no change
    with pytest.raises(statekeel.NotFound):
        await sm.expire("missing")


async def test_delete_removes_the_session_and_its_messages(store: statekeel.Store) -> None:
    sm = store.sessions
    await saved(store, "s", 3)
    assert await sm.delete("s") is True
    assert await sm.load("s") is None
    assert await store.backend.read_messages("s") == []
    assert await sm.delete("s") is False


async def test_cleanup_expires_idle_active_sessions_and_archives_idle_expired_ones(
    store: statekeel.Store,
) -> None:
    sm = store.sessions
    await saved(store, "idle")
    await saved(store, "also-idle")
    await saved(store, "old-expired")
    await sm.expire("old-expired")
    now = dt.datetime.now(dt.UTC)
    changed = await sm.cleanup_expired(now + dt.timedelta(hours=2), expiry_hours=1, archive_hours=1000)
    assert changed == 2  # idle, also-idle -> expired; old-expired stays expired (archive_hours not reached)
    statuses = {r.key: r.status for r in (await sm.list()).items}
    assert statuses == {"idle": "expired", "also-idle": "expired", "old-expired": "expired"}
    assert await sm.cleanup_expired(now + dt.timedelta(hours=1001), expiry_hours=1, archive_hours=1000) == 3
    assert {r.status for r in (await sm.list()).items} == {"archived"}
    assert await sm.cleanup_expired(now) == 0
    with pytest.raises(statekeel.InvalidArgument):
        await sm.cleanup_expired(dt.datetime(2026, 1, 1))  # naive


async def test_cleanup_leaves_recent_sessions_alone(store: statekeel.Store) -> None:
    await saved(store, "s")
    assert await store.sessions.cleanup_expired() == 0
    assert (await store.backend.load_session("s")).status == "active"  # type: ignore[union-attr]


@pytest.mark.kinds("sessions", "tool_calls", "transactions")
async def test_list_pages_10000_sessions_newest_first_without_gaps(store: statekeel.Store) -> None:
    n = 10_000
    msg = NewMessage("user", store.codec.encode({"role": "user", "content": "x"}))
    async with store.backend.atomic():
        for i in range(n):
            await store.backend.append_messages(f"s{i:05d}", 0, [msg], create=True)
    await store.sessions.expire("s00007")
    seen: list[str] = []
    cursor = None
    pages = 0
    last = None
    while True:
        page = await store.sessions.list(limit=1000, cursor=cursor)
        pages += 1
        for rec in page.items:
            key = (rec.updated_at, rec.key)
            assert last is None or key < last  # strictly newest first
            last = key
            seen.append(rec.key)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert pages == 10 and len(seen) == n and len(set(seen)) == n
    assert seen[0] == "s00007"  # expire touched it last
    expired = await store.sessions.list(status="expired")
    assert [r.key for r in expired.items] == ["s00007"] and expired.next_cursor is None


@pytest.mark.kinds("sessions", "tool_calls", "transactions")
async def test_iter_yields_every_session_newest_first_across_pages(store: statekeel.Store) -> None:
    n = 1234
    msg = NewMessage("user", store.codec.encode({"role": "user", "content": "x"}))
    async with store.backend.atomic():
        for i in range(n):
            await store.backend.append_messages(f"s{i:04d}", 0, [msg], create=True)
    await store.sessions.expire("s0007")
    await store.sessions.archive("s0100")
    records = [r async for r in store.sessions.iter(page_size=100)]
    keys = [r.key for r in records]
    assert len(keys) == n and len(set(keys)) == n
    order = [(r.updated_at, r.key) for r in records]
    assert order == sorted(order, reverse=True)  # strictly newest first, as list() pages them
    assert keys[:2] == ["s0100", "s0007"]
    assert [r.key async for r in store.sessions.iter("expired", page_size=1)] == ["s0007"]
    assert [r.key async for r in store.sessions.iter(status="archived")] == ["s0100"]


@pytest.mark.parametrize(
    "kwargs", [{"status": "paused"}, {"page_size": 0}, {"page_size": 1001}, {"page_size": "10"}]
)
async def test_iter_refuses_bad_arguments_when_called(store: statekeel.Store, kwargs: dict[str, Any]) -> None:
    with pytest.raises(statekeel.InvalidArgument):
        store.sessions.iter(**kwargs)  # raised at the call, before anything is read


# --- compression -----------------------------------------------------------------------------------------


async def test_compress_moves_messages_to_the_archive_atomically_and_load_reads_only_the_rest(
    store: statekeel.Store,
) -> None:
    sm = store.sessions
    s = await saved(store, "s", 10)
    everything = list(s.messages)
    cid = await sm.compress("s", 6, "six messages about nothing")
    assert s.last_consolidated == 6 and s.messages == everything[6:]  # the cached session follows
    fresh = await statekeel.SessionManager(store.backend, store.codec).load("s")
    assert fresh is not None
    assert fresh.messages == everything[6:] and fresh.last_consolidated == 6 and fresh.head_seq == 10
    assert [(x.compression_id, x.first_seq, x.upto_seq) for x in fresh.summaries] == [(cid, 0, 6)]
    archived = await sm.archived("s", cid)
    assert [a.payload for a in archived] == everything[:6] and [a.seq for a in archived] == list(range(6))
    cid2 = await sm.compress("s", 8, "two more")
    assert [a.compression_id for a in await sm.archived("s")] == [cid] * 6 + [cid2] * 2
    full = await statekeel.SessionManager(store.backend, store.codec).load("s", include_archived=True)
    assert full is not None and full.messages == everything and full.head_seq == 10
    assert await stored(store, "s") == everything


@pytest.mark.parametrize("upto", [0, 4, 11, -1])
async def test_compress_out_of_range_is_refused_and_writes_nothing(store: statekeel.Store, upto: int) -> None:
    sm = store.sessions
    await saved(store, "s", 10)
    await sm.compress("s", 4, "first")
    before = await store.backend.load_session("s")
    with pytest.raises(statekeel.InvalidArgument):
        await sm.compress("s", upto, "bad")
    assert await store.backend.load_session("s") == before
    assert len(await sm.archived("s")) == 4
    with pytest.raises(statekeel.InvalidArgument):
        await sm.compress("s", 6, None)  # type: ignore[arg-type]
    with pytest.raises(statekeel.NotFound):
        await sm.compress("missing", 1, "x")


async def test_messages_added_after_compression_keep_dense_sequence_numbers(store: statekeel.Store) -> None:
    sm = store.sessions
    s = await saved(store, "s", 4)
    await sm.compress("s", 3, "sum")
    s.add_message("user", "after")
    await sm.save(s)
    assert [m["content"] for m in await stored(store, "s")] == ["s-0", "s-1", "s-2", "s-3", "after"]


# --- cache -----------------------------------------------------------------------------------------------


async def test_same_session_object_while_cached_and_reload_after_eviction(
    store_url: str, tmp_path: Any
) -> None:
    async with statekeel.open_store(store_url, cache_size=2, fallback_dir=os.fspath(tmp_path)) as st:
        sm = st.sessions
        a = await sm.get_or_create("a")
        a.add_message("user", "in a")
        await sm.save(a)
        assert await sm.load("a") is a
        await sm.get_or_create("b")
        await sm.get_or_create("c")  # evicts a
        assert sm.cached("a") is None
        again = await sm.load("a")
        assert (
            again is not a and again is not None and again.messages == [{"role": "user", "content": "in a"}]
        )


async def test_eviction_saves_a_dirty_session_first(store_url: str, tmp_path: Any) -> None:
    async with statekeel.open_store(store_url, cache_size=1, fallback_dir=os.fspath(tmp_path)) as st:
        sm = st.sessions
        a = await sm.get_or_create("a")
        a.add_message("user", "never explicitly saved")
        a.metadata["x"] = 1
        await sm.get_or_create("b")  # evicts a, saving it
        assert sm.cached("a") is None
        rec = await st.backend.load_session("a")
        assert rec is not None and rec.head_seq == 1 and rec.metadata == {"x": 1}


async def test_a_dirty_session_whose_save_fails_stays_cached(store_url: str, tmp_path: Any) -> None:
    async with statekeel.open_store(store_url, cache_size=1, fallback_dir=os.fspath(tmp_path)) as st:
        sm = st.sessions
        other = statekeel.SessionManager(st.backend, st.codec)
        a = await sm.get_or_create("a")
        a.add_message("user", "mine")
        theirs = await other.get_or_create("a")
        theirs.add_message("user", "theirs")
        await other.save(theirs)
        await sm.get_or_create("b")  # a's save conflicts: a stays cached, with a warning
        assert sm.cached("a") is a and sm.cached("b") is not None
        assert [m["content"] for m in await stored(st, "a")] == ["theirs"]


async def test_load_sees_another_writers_appends_instead_of_a_stale_cache(store: statekeel.Store) -> None:
    sm = store.sessions
    other = statekeel.SessionManager(store.backend, store.codec)
    await saved(store, "s", 1)
    theirs = await other.load("s")
    assert theirs is not None
    theirs.add_message("assistant", "new")
    await other.save(theirs)
    mine = await sm.load("s")
    assert mine is not None and [m["content"] for m in mine.messages] == ["s-0", "new"]


async def test_open_saves_on_exit_also_when_the_block_raises(store: statekeel.Store) -> None:
    sm = store.sessions
    with pytest.raises(RuntimeError):
        async with sm.open("s") as s:
            s.add_message("user", "before the crash")
            raise RuntimeError("tool blew up")
    assert [m["content"] for m in await stored(store, "s")] == ["before the crash"]
    async with sm.open("s") as s:
        assert [m["content"] for m in s.messages] == ["before the crash"]
        s.add_message("assistant", "recovered")
    assert len(await stored(store, "s")) == 2


async def test_unique_keys_per_test_do_not_leak(store: statekeel.Store) -> None:
    # A sanity check of the fixture: every test starts from an empty store.
    assert (await store.sessions.list()).items == []
    assert uuid.uuid4()


@pytest.mark.parametrize("metadata", [["a"], "text", 3, None])
async def test_metadata_that_is_not_a_dict_is_refused_before_anything_is_written(
    store: statekeel.Store, metadata: Any
) -> None:
    sm = store.sessions
    s = await sm.get_or_create("m")
    s.add_message("user", "hello")
    await sm.save(s)
    s.metadata = metadata
    s.add_message("user", "not saved")
    with pytest.raises(statekeel.InvalidArgument, match="metadata must be a dict"):
        await sm.save(s)
    record = await store.backend.load_session("m")
    assert record is not None and record.metadata == {} and record.head_seq == 1
    # The store stays usable: fixing the metadata saves both.
    s.metadata = {"ok": True}
    await sm.save(s)
    assert await stored_contents(store, "m") == ["hello", "not saved"]


async def test_a_new_session_with_non_dict_metadata_is_not_created(store: statekeel.Store) -> None:
    sm = store.sessions
    s = await sm.get_or_create("fresh")
    s.metadata = ["x"]
    with pytest.raises(statekeel.InvalidArgument):
        await sm.save(s)
    assert await store.backend.load_session("fresh") is None


async def test_messages_cut_and_regrown_past_the_saved_head_are_refused_not_dropped(
    store: statekeel.Store,
) -> None:
    sm = store.sessions
    s = await sm.get_or_create("trim")
    for i in range(15):
        s.add_message("user", f"m{i}")
    await sm.save(s)
    # A caller trims its context in place, then the conversation goes on past the saved length:
    # the saved head no longer points at the first new message.
    s.messages = s.messages[-10:]
    for i in range(6):
        s.add_message("user", f"n{i}")
    with pytest.raises(statekeel.InvalidArgument, match="append-only"):
        await sm.save(s)
    assert await stored_contents(store, "trim") == [f"m{i}" for i in range(15)]


async def test_messages_replaced_by_equal_copies_still_save(store: statekeel.Store) -> None:
    sm = store.sessions
    s = await sm.get_or_create("copy")
    s.add_message("user", "a", at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    await sm.save(s)
    s.messages = [dict(m) for m in s.messages]  # equal, not identical: nothing was cut
    s.add_message("assistant", "b")
    await sm.save(s)
    fresh = await SessionManager(store.backend, store.codec).load("copy")
    assert fresh is not None and [m["content"] for m in fresh.messages] == ["a", "b"]


async def test_saving_after_a_reload_and_after_compression_keeps_appending(store: statekeel.Store) -> None:
    sm = store.sessions
    s = await sm.get_or_create("c")
    for i in range(4):
        s.add_message("user", f"m{i}")
    await sm.save(s)
    await sm.compress("c", 2, "first two")
    s.add_message("user", "m4")
    await sm.save(s)
    other = SessionManager(store.backend, store.codec)
    again = await other.load("c")
    assert again is not None
    again.add_message("user", "m5")
    await other.save(again)
    assert await stored_contents(store, "c") == [f"m{i}" for i in range(6)]


@pytest.mark.parametrize(
    "hours",
    [float("inf"), float("nan"), 1e9, 1e15],
)
async def test_cleanup_expired_with_out_of_range_hours_raises_a_typed_error(
    store: statekeel.Store, hours: float
) -> None:
    sm = store.sessions
    s = await sm.get_or_create("idle")
    s.add_message("user", "x")
    await sm.save(s)
    with pytest.raises(statekeel.InvalidArgument, match="expiry_hours"):
        await sm.cleanup_expired(expiry_hours=hours)
    with pytest.raises(statekeel.InvalidArgument, match="archive_hours"):
        await sm.cleanup_expired(archive_hours=hours)
    record = await store.backend.load_session("idle")
    assert record is not None and record.status == "active"
    assert await sm.cleanup_expired(now=dt.datetime.now(dt.UTC) + dt.timedelta(days=2)) == 1


@pytest.mark.parametrize("name", ["lease_seconds", "lock_timeout", "expiry_hours", "archive_hours"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e300])
async def test_manager_durations_that_would_overflow_or_never_compare_are_refused(
    store: statekeel.Store, name: str, value: float
) -> None:
    if name == "lock_timeout" and value > 1e9:
        SessionManager(store.backend, store.codec, lock_timeout=value)  # waiting forever is allowed
        return
    with pytest.raises(statekeel.InvalidArgument, match=name):
        SessionManager(store.backend, store.codec, **{name: value})


async def _recreate(sm: SessionManager, key: str, contents: list[str]) -> None:
    assert await sm.delete(key)
    fresh = await sm.get_or_create(key)
    for c in contents:
        fresh.add_message("user", c)
    await sm.save(fresh)


async def test_a_stale_session_cannot_append_to_one_deleted_and_created_again_at_the_same_head(
    store: statekeel.Store,
) -> None:
    a = SessionManager(store.backend, store.codec)
    b = SessionManager(store.backend, store.codec)
    s = await a.get_or_create("u")
    s.add_message("user", "old question")
    s.add_message("assistant", "old answer")
    await a.save(s)
    s.add_message("assistant", "late reply to the old conversation")
    await _recreate(b, "u", ["new question", "new answer"])  # same key, same head 2
    with pytest.raises(statekeel.ConflictError, match="created again"):
        await a.save(s)
    assert await stored_contents(store, "u") == ["new question", "new answer"]


async def test_a_cached_session_is_reloaded_after_another_writer_deleted_and_recreated_it(
    store: statekeel.Store,
) -> None:
    a = SessionManager(store.backend, store.codec)
    b = SessionManager(store.backend, store.codec)
    s = await a.get_or_create("u")
    s.add_message("user", "old")
    await a.save(s)
    await _recreate(b, "u", ["new"])
    again = await a.get_or_create("u")
    assert [m["content"] for m in again.messages] == ["new"]  # not the cached old incarnation
    again.add_message("assistant", "reply")
    await a.save(again)
    assert await stored_contents(store, "u") == ["new", "reply"]


@pytest.mark.parametrize("summary", ["with \x00 NUL", "lone \ud800 surrogate", 3])
async def test_a_compression_summary_every_backend_cannot_store_is_refused_before_writing(
    store: statekeel.Store, summary: Any
) -> None:
    sm = store.sessions
    s = await sm.get_or_create("k")
    for c in ("a", "b", "c"):
        s.add_message("user", c)
    await sm.save(s)
    with pytest.raises(statekeel.InvalidArgument, match="summary"):
        await sm.compress("k", 2, summary)
    record = await store.backend.load_session("k")
    assert record is not None and record.last_consolidated == 0
    assert await sm.archived("k") == []
    await sm.compress("k", 2, "")  # an empty summary is still allowed; the store is usable
    assert await stored_contents(store, "k") == ["a", "b", "c"]


# --- other writers and atomic() blocks: no acknowledged write lost -----------------------------------------


async def changed_elsewhere(store: statekeel.Store, key: str, change: Callable[[Session], Any]) -> None:
    """Another writer (its own manager, as another process would have) loads the session, changes it and
    saves it."""
    other = SessionManager(store.backend, store.codec)
    theirs = await other.load(key)
    assert theirs is not None
    change(theirs)
    await other.save(theirs)


async def test_compress_after_another_writer_appended_never_drops_an_unsaved_message(
    store: statekeel.Store,
) -> None:
    sm = store.sessions
    s = await saved(store, "s", 5)
    s.add_message("user", "unsaved")
    await changed_elsewhere(store, "s", lambda t: [t.add_message("user", f"t-{i}") for i in range(2)])
    await sm.compress("s", 7, "seven messages")
    assert [m["content"] for m in s.unsaved()] == ["unsaved"]  # still there, still unsaved
    with pytest.raises(statekeel.ConflictError):
        await sm.save(s)  # another writer moved the head: a conflict, never a silent no-op
    again = await sm.load("s")
    assert again is not None and again is not s and again.last_consolidated == 7
    again.add_message("user", "unsaved")
    await sm.save(again)
    assert await stored_contents(store, "s") == [f"s-{i}" for i in range(5)] + ["t-0", "t-1", "unsaved"]


@pytest.mark.kinds("sessions", "tool_calls", "transactions")
async def test_a_save_inside_a_rolled_back_atomic_block_leaves_its_messages_unsaved(
    store: statekeel.Store,
) -> None:
    sm = store.sessions
    s = await saved(store, "s", 1)
    with pytest.raises(RuntimeError):
        async with store.backend.atomic():
            async with store.backend.atomic():  # a nested block settles with the outermost one
                s.add_message("user", "in the block")
                await sm.save(s)
            assert s.unsaved() == []  # saved, as far as the rest of the block can tell
            s.metadata["topic"] = "rolled back"
            await sm.save(s)
            raise RuntimeError("the block fails after the saves")
    assert [m["content"] for m in s.unsaved()] == ["in the block"] and s.saved_head == 1
    assert s.is_dirty() and s.metadata == {"topic": "rolled back"}
    assert await stored_contents(store, "s") == ["s-0"]
    await sm.save(s)  # the next save writes what the block's rollback took back
    assert await stored_contents(store, "s") == ["s-0", "in the block"]
    record = await store.backend.load_session("s")
    assert record is not None and record.metadata == {"topic": "rolled back"}
    # A session created inside a rolled-back block is created by the next save.
    fresh = await sm.get_or_create("new")
    with pytest.raises(RuntimeError):
        async with store.backend.atomic():
            fresh.add_message("user", "first")
            await sm.save(fresh)
            raise RuntimeError("rolled back")
    assert await store.backend.load_session("new") is None
    await sm.save(fresh)
    assert await stored_contents(store, "new") == ["first"]
    # A block that commits settles its saves.
    async with store.backend.atomic():
        s.add_message("user", "committed")
        await sm.save(s)
    assert s.unsaved() == [] and s.saved_head == 3


@pytest.mark.parametrize("ours", ["save", "compress", "expire"])
async def test_another_writers_metadata_change_is_seen_after_our_next_write_and_never_overwritten(
    store: statekeel.Store, ours: str
) -> None:
    sm = store.sessions
    s = await saved(store, "s", 2)
    await changed_elsewhere(store, "s", lambda t: t.metadata.update(topic="theirs"))
    if ours == "save":
        s.add_message("user", "mine")
        await sm.save(s)
    elif ours == "compress":
        await sm.compress("s", 1, "first")
    else:
        await sm.expire("s")
    mine = await sm.load("s")
    assert mine is not None and mine.metadata == {"topic": "theirs"}
    mine.metadata["mine"] = True
    await sm.save(mine)
    record = await store.backend.load_session("s")
    assert record is not None and record.metadata == {"topic": "theirs", "mine": True}


async def test_a_session_archived_by_another_writer_stays_archived_after_our_saves(
    store: statekeel.Store,
) -> None:
    sm = store.sessions
    other = SessionManager(store.backend, store.codec)
    s = await saved(store, "s", 1)
    await other.archive("s")
    s.add_message("assistant", "late reply")
    await sm.save(s)  # messages only: no conflict
    assert s.status == "archived"
    mine = await sm.load("s")
    assert mine is s and mine.status == "archived" and not mine.is_dirty()
    mine.metadata["note"] = "kept"
    await sm.save(mine)
    record = await store.backend.load_session("s")
    assert record is not None and record.status == "archived" and record.metadata == {"note": "kept"}
    assert await stored_contents(store, "s") == ["s-0", "late reply"]


async def test_concurrent_metadata_or_status_edits_at_one_head_conflict_like_messages(
    store: statekeel.Store,
) -> None:
    sm = store.sessions
    mine = await saved(store, "s", 1)
    await changed_elsewhere(store, "s", lambda t: t.metadata.update(owner="them"))
    mine.metadata["owner"] = "me"
    with pytest.raises(statekeel.ConflictError) as info:
        await sm.save(mine)
    assert "metadata or status" in str(info.value)
    record = await store.backend.load_session("s")
    assert record is not None and record.metadata == {"owner": "them"}
    # Reloading gives the stored version; re-applying the change then saves it.
    again = await sm.load("s")
    assert again is not None and again is not mine and again.metadata == {"owner": "them"}
    again.metadata["owner"] = "me"
    await sm.save(again)
    # Status follows the same rule.
    again.status = "archived"
    await changed_elsewhere(store, "s", lambda t: setattr(t, "status", "expired"))
    with pytest.raises(statekeel.ConflictError):
        await sm.save(again)
    record = await store.backend.load_session("s")
    assert record is not None and record.status == "expired" and record.metadata == {"owner": "me"}


async def test_concurrent_loads_of_a_stale_cached_session_both_return_the_stored_version(
    store: statekeel.Store,
) -> None:
    sm = store.sessions
    await saved(store, "s", 1)
    await changed_elsewhere(store, "s", lambda t: t.add_message("assistant", "new"))
    first, second = await asyncio.gather(sm.load("s"), sm.load("s"))
    for loaded in (first, second):
        assert loaded is not None and [m["content"] for m in loaded.messages] == ["s-0", "new"]


# --- saves whose answer never came, and saves on a closed store -----------------------------------------


class CommitThenHang:
    """Stands in for the backend's ``append_messages``: the append commits, then the call never returns —
    as when the caller gives up (``asyncio.wait_for``) after the COMMIT, before hearing of it."""

    def __init__(self, backend: Any) -> None:
        self.append = backend.append_messages
        self.committed = asyncio.Event()

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        record = await self.append(*args, **kwargs)
        self.committed.set()
        await asyncio.Event().wait()
        return record


async def save_cancelled_after_commit(
    store: statekeel.Store, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = CommitThenHang(store.backend)
    with monkeypatch.context() as patch:
        patch.setattr(store.backend, "append_messages", hook)
        save = asyncio.create_task(store.sessions.save(session))
        await hook.committed.wait()
        save.cancel()
        with pytest.raises(asyncio.CancelledError):
            await save


async def a_saved_b_cancelled_after_commit(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> Session:
    """Session "s" with "a" saved, and "b" saved by a save cancelled after its commit."""
    s = await store.sessions.get_or_create("s")
    s.add_message("user", "a")
    await store.sessions.save(s)
    s.add_message("assistant", "b")
    await save_cancelled_after_commit(store, s, monkeypatch)
    return s


async def test_a_save_cancelled_after_its_commit_is_settled_by_the_next_save_without_duplicate_or_conflict(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    sm = store.sessions
    s = await sm.get_or_create("s")
    s.add_message("user", "a")
    await save_cancelled_after_commit(store, s, monkeypatch)  # the save that creates it
    s.add_message("assistant", "b")
    await sm.save(s)
    s.add_message("user", "c")
    await save_cancelled_after_commit(store, s, monkeypatch)
    s.metadata["topic"] = "build"
    await save_cancelled_after_commit(store, s, monkeypatch)  # metadata alone, conditional on the version
    s.add_message("assistant", "d")
    s.metadata["done"] = True
    await sm.save(s)
    assert await stored_contents(store, "s") == ["a", "b", "c", "d"]
    assert not s.is_dirty()
    record = await store.backend.load_session("s")
    assert record is not None and record.metadata == {"topic": "build", "done": True}
    again = await statekeel.SessionManager(store.backend, store.codec).load("s")
    assert again is not None and [m["content"] for m in again.messages] == ["a", "b", "c", "d"]


async def test_a_load_after_a_save_cancelled_after_its_commit_returns_the_session_settled(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    sm = store.sessions
    s = await a_saved_b_cancelled_after_commit(store, monkeypatch)
    assert await sm.load("s") is s  # its own write: not mistaken for another writer's
    assert not s.is_dirty() and s.saved_head == 2
    s.add_message("user", "c")
    await sm.save(s)
    assert await stored_contents(store, "s") == ["a", "b", "c"]


async def append_elsewhere(store: statekeel.Store, key: str, content: str) -> None:
    """Another writer (a manager of its own on the same backend) appends one message."""
    other = statekeel.SessionManager(store.backend, store.codec)
    theirs = await other.load(key)
    assert theirs is not None
    theirs.add_message("user", content)
    await other.save(theirs)


async def test_another_writer_after_a_cancelled_save_still_makes_the_next_save_conflict(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    sm = store.sessions
    s = await a_saved_b_cancelled_after_commit(store, monkeypatch)
    await append_elsewhere(store, "s", "theirs")
    s.add_message("user", "c")
    with pytest.raises(statekeel.ConflictError):
        await sm.save(s)
    assert await stored_contents(store, "s") == ["a", "b", "theirs"]


async def a_saved_b_reply_lost(store: statekeel.Store, monkeypatch: pytest.MonkeyPatch) -> Session:
    """Session "s" with "a" saved, and "b" saved by a save that landed and whose reply was lost: the
    backend's call raised outcome unknown, so the save kept "b" in its fallback file."""
    s = await store.sessions.get_or_create("s")
    s.add_message("user", "a")
    await store.sessions.save(s)
    s.add_message("assistant", "b")
    with lose_the_next_reply(store, monkeypatch) as lost:
        await store.sessions.save(s)  # it cannot know: kept in its fallback file
    assert lost.landed and lost.swallowed >= 1
    assert [m["content"] for m in s.unsaved()] == ["b"]
    assert await stored_contents(store, "s") == ["a", "b"]
    return s


async def test_a_write_whose_reply_was_lost_after_it_landed_raises_unknown_outcome(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = await store.sessions.get_or_create("s")
    s.add_message("user", "a")
    await store.sessions.save(s)
    batch = [NewMessage("assistant", store.codec.encode({"role": "assistant", "content": "b"}))]
    with lose_the_next_reply(store, monkeypatch), pytest.raises(statekeel.BackendUnavailable) as info:
        await store.backend.append_messages("s", 1, batch, write_id="w-lost")
    assert info.value.outcome == "unknown"  # type: ignore[attr-defined]
    assert await stored_contents(store, "s") == ["a", "b"]  # it landed, once


async def test_a_save_whose_reply_was_lost_is_settled_by_the_next_save_without_duplicate_or_conflict(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    s = await a_saved_b_reply_lost(store, monkeypatch)
    assert len(fallback_files(os.path.join(os.fspath(tmp_path), "fallback"))) == 1
    s.add_message("user", "c")
    await store.sessions.save(s)  # its own write, recognised by its write id
    assert await stored_contents(store, "s") == ["a", "b", "c"]
    assert not s.is_dirty()
    assert fallback_files(os.path.join(os.fspath(tmp_path), "fallback")) == []


async def test_a_load_after_a_save_whose_reply_was_lost_returns_the_session_settled(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = await a_saved_b_reply_lost(store, monkeypatch)
    assert await store.sessions.load("s") is s
    assert not s.is_dirty() and s.saved_head == 2
    s.add_message("user", "c")
    await store.sessions.save(s)
    assert await stored_contents(store, "s") == ["a", "b", "c"]


async def test_another_writer_after_a_save_whose_reply_was_lost_still_makes_the_next_save_conflict(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = await a_saved_b_reply_lost(store, monkeypatch)
    await append_elsewhere(store, "s", "theirs")
    s.add_message("user", "c")
    with pytest.raises(statekeel.ConflictError):
        await store.sessions.save(s)
    assert await stored_contents(store, "s") == ["a", "b", "theirs"]


async def test_a_save_that_never_reached_the_backend_before_another_writer_still_conflicts(
    store: statekeel.Store,
) -> None:
    sm = store.sessions
    s = await sm.get_or_create("s")
    s.add_message("user", "a")
    await sm.save(s)
    s.add_message("assistant", "b")
    save = asyncio.create_task(sm.save(s))
    save.cancel()  # before it ran at all
    with pytest.raises(asyncio.CancelledError):
        await save
    await append_elsewhere(store, "s", "theirs")
    with pytest.raises(statekeel.ConflictError):
        await sm.save(s)
    assert await stored_contents(store, "s") == ["a", "theirs"]


def fallback_files(directory: str | os.PathLike[str]) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(directory) for f in files]


async def test_a_save_on_a_closed_store_raises_and_writes_nothing(store_url: str, tmp_path: Any) -> None:
    fallback = os.path.join(os.fspath(tmp_path), "closed-fallback")
    store = await statekeel.open_store(store_url, fallback_dir=fallback)
    saved = await store.sessions.get_or_create("saved")
    saved.add_message("user", "before close")
    await store.sessions.save(saved)
    new = await store.sessions.get_or_create("new")
    new.add_message("user", "never saved")
    saved.add_message("user", "after close")
    await store.close()
    for session in (saved, new):
        with pytest.raises(statekeel.BackendUnavailable, match="closed"):
            await store.sessions.save(session)
    assert fallback_files(fallback) == []
    if store_url != "memory://":  # an in-memory store is gone once closed
        async with statekeel.open_store(store_url) as reopened:
            assert await stored_contents(reopened, "saved") == ["before close"]
            assert await reopened.backend.load_session("new") is None


async def test_snapshot_reads_a_session_as_stored_without_repairing_it(store: statekeel.Store) -> None:
    assert await store.sessions.snapshot("nobody") is None
    async with store.sessions.open("chat") as session:
        for i in range(4):
            session.add_message("user", f"turn {i}")
    await store.sessions.compress("chat", 2, "two turns")
    loaded = await store.sessions.snapshot("chat")
    assert loaded is not None
    assert loaded.first_seq == 0 and len(loaded.messages) == 4
    assert [s[1:] for s in loaded.summaries] == [(0, 2, "two turns")]
    live = await store.sessions.snapshot("chat", include_archived=False)
    assert live is not None and live.first_seq == 2 and len(live.messages) == 2
    assert store.sessions.cached("chat") is None or store.sessions.cached("chat") is not loaded
    with pytest.raises(statekeel.InvalidKey):
        await store.sessions.snapshot("")


# --- a cached session's reload never silently discards a local edit ---------------------------------------


@pytest.mark.parametrize("edit", ["metadata", "status"])
async def test_a_reload_after_another_writer_appended_keeps_the_cached_edit_and_saves_it_on_top(
    store: statekeel.Store, edit: str
) -> None:
    sm = store.sessions
    s = await saved(store, "s", 1)
    if edit == "metadata":
        s.metadata["mine"] = 1
    else:
        s.status = "expired"
    await changed_elsewhere(store, "s", lambda t: t.add_message("assistant", "theirs"))
    again = await sm.load("s")  # the cached session fell behind: read again
    assert again is not None and [m["content"] for m in again.messages] == ["s-0", "theirs"]
    assert again.is_dirty()  # the edit is still there, unsaved
    await sm.save(again)
    record = await store.backend.load_session("s")
    assert record is not None and record.head_seq == 2
    assert (record.metadata, record.status) == (
        ({"mine": 1}, "active") if edit == "metadata" else ({}, "expired")
    )


@pytest.mark.parametrize("edit", ["metadata", "status"])
async def test_a_reload_after_another_writer_changed_the_same_field_makes_the_save_conflict_not_drop_it(
    store: statekeel.Store, edit: str
) -> None:
    sm = store.sessions
    s = await saved(store, "s", 1)

    def theirs(t: Session) -> None:
        t.add_message("assistant", "theirs")
        if edit == "metadata":
            t.metadata["theirs"] = 2
        else:
            t.status = "archived"

    if edit == "metadata":
        s.metadata["mine"] = 1
    else:
        s.status = "expired"
    await changed_elsewhere(store, "s", theirs)
    again = await sm.load("s")
    assert again is not None and [m["content"] for m in again.messages] == ["s-0", "theirs"]
    second = await sm.load("s")  # a second reload still holds the edit
    assert second is not None
    for session in (again, second):
        with pytest.raises(statekeel.ConflictError):
            await sm.save(session)  # never a normal return having dropped "mine"
    record = await store.backend.load_session("s")
    assert record is not None
    assert (record.metadata, record.status) == (
        ({"theirs": 2}, "active") if edit == "metadata" else ({}, "archived")
    )
    fresh = await sm.load("s")  # told of the conflict: the next load is the stored version
    assert fresh is not None and not fresh.is_dirty()
    if edit == "metadata":
        fresh.metadata["mine"] = 1
    else:
        fresh.status = "expired"
    await sm.save(fresh)  # re-applied on top
    record = await store.backend.load_session("s")
    assert record is not None
    assert (record.metadata, record.status) == (
        ({"theirs": 2, "mine": 1}, "active") if edit == "metadata" else ({}, "expired")
    )
