"""Review of SessionManager on every backend: input that used to slip past validation and get written
(or silently dropped), and numbers that used to raise untyped errors."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

import statekeel
from statekeel.sessions import SessionManager


async def stored(store: statekeel.Store, key: str) -> list[Any]:
    found = await store.backend.load_session_with_messages(key, include_archived=True)
    assert found is not None
    record, rows = found
    assert [r.seq for r in rows] == list(range(record.head_seq))
    return [r.payload["content"] for r in rows]


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
    assert await stored(store, "m") == ["hello", "not saved"]


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
    assert await stored(store, "trim") == [f"m{i}" for i in range(15)]


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
    assert await stored(store, "c") == [f"m{i}" for i in range(6)]


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


async def test_an_infinite_lease_no_longer_crashes_the_lock_with_an_untyped_error(
    store: statekeel.Store,
) -> None:
    # Before: accepted, then OverflowError from inside the lease write on the first lock.
    with pytest.raises(statekeel.InvalidArgument):
        SessionManager(store.backend, store.codec, lease_seconds=float("inf"))
    sm = SessionManager(store.backend, store.codec, lease_seconds=1e6)
    async with sm.open("long") as s:
        s.add_message("user", "x")


async def test_a_nan_lock_timeout_is_refused_and_the_lock_stays_free(store: statekeel.Store) -> None:
    lock = store.sessions.lock("k")
    with pytest.raises(statekeel.InvalidArgument, match="timeout"):
        await lock.acquire(float("nan"))
    assert not lock.locked()
    async with store.sessions.open("k", timeout=1) as s:  # still usable
        s.add_message("user", "x")


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
    assert await stored(store, "u") == ["new question", "new answer"]


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
    assert await stored(store, "u") == ["new", "reply"]


async def test_append_messages_rejects_a_naive_expected_created_at(store: statekeel.Store) -> None:
    s = await store.sessions.get_or_create("k")
    s.add_message("user", "x")
    await store.sessions.save(s)
    with pytest.raises(statekeel.InvalidArgument, match="expected_created_at"):
        await store.backend.append_messages("k", 1, [], expected_created_at=dt.datetime(2026, 1, 1))


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
    assert await stored(store, "k") == ["a", "b", "c"]
