"""Session locks: one holder per session in a process (reference-counted asyncio locks) and across
processes and machines (a lease row with a fencing token), on every backend."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import statekeel
from helpers import contents, message
from statekeel.sessions import SessionManager

pytestmark = pytest.mark.kinds("sessions", "tool_calls")


async def test_same_lock_object_for_the_same_key_and_different_for_different_keys(
    store: statekeel.Store,
) -> None:
    sm = store.sessions
    a = sm.lock("a")
    assert sm.lock("a") is a
    assert sm.lock("b") is not a


async def test_unused_locks_are_dropped_from_the_table(store: statekeel.Store) -> None:
    sm = store.sessions
    for i in range(1000):
        async with sm.lock(f"k{i}"):
            pass
    # A released lock's cancelled lease renewer is finalized by the event loop's next turn.
    await asyncio.sleep(0)
    gc.collect()
    assert len(sm._locks) == 0  # nobody holds or waits: the table does not grow without bound


async def test_work_on_one_key_is_serialized_and_different_keys_run_concurrently(
    store: statekeel.Store,
) -> None:
    sm = store.sessions
    inside = 0
    most = 0

    async def worker(i: int) -> None:
        nonlocal inside, most
        async with sm.open("shared") as s:
            inside += 1
            most = max(most, inside)
            s.add_message("user", f"q{i}")
            await asyncio.sleep(0)  # let the others try to get in
            s.add_message("assistant", f"a{i}")
            inside -= 1

    await asyncio.gather(*(worker(i) for i in range(20)))
    assert most == 1
    got = await contents(store, "shared")
    assert len(got) == 40
    for t in range(20):  # each turn whole, never interleaved with another
        q, a = got[2 * t], got[2 * t + 1]
        assert q[0] == "q" and a == "a" + q[1:]

    # Different keys: each holder waits for the other to be inside its own lock at the same time.
    a_in, b_in = asyncio.Event(), asyncio.Event()

    async def hold(key: str, mine: asyncio.Event, theirs: asyncio.Event) -> None:
        async with sm.lock(key):
            mine.set()
            await theirs.wait()

    async with asyncio.timeout(10):
        await asyncio.gather(hold("x", a_in, b_in), hold("y", b_in, a_in))


async def test_lock_is_reentrant_within_one_task(store: statekeel.Store) -> None:
    sm = store.sessions
    async with sm.lock("s"), sm.open("s") as s:
        s.add_message("user", "nested")
    assert not sm.lock("s").locked()
    assert await contents(store, "s") == ["nested"]


async def test_with_cache_size_1_and_1000_keys_a_held_lock_is_never_lost(
    store_url: str, tmp_path: Path
) -> None:
    async with statekeel.open_store(store_url, cache_size=1, fallback_dir=os.fspath(tmp_path)) as st:
        sm = st.sessions
        held = sm.lock("k0")
        release = asyncio.Event()
        entered = asyncio.Event()

        async def holder() -> None:
            async with sm.open("k0") as s:
                s.add_message("user", "held")
                entered.set()
                await release.wait()

        task = asyncio.create_task(holder())
        await entered.wait()
        session = sm.cached("k0")
        for i in range(1, 1000):
            async with sm.open(f"k{i}") as s:
                s.add_message("user", str(i))
            assert sm.lock("k0") is held and held.locked()
        assert sm.cached("k0") is session  # a held session is never evicted
        assert len(sm._cache) <= 2
        with pytest.raises(statekeel.ConflictError):
            await sm.lock("k0").acquire(timeout=0.05)  # still held: nobody else gets it
        release.set()
        await task
        await held.acquire(timeout=5)
        await held.release()
        assert await contents(st, "k0") == ["held"]
        assert await contents(st, "k999") == ["999"]


async def test_release_by_a_task_that_does_not_hold_the_lock_is_refused(store: statekeel.Store) -> None:
    lock = store.sessions.lock("s")
    with pytest.raises(statekeel.InvalidArgument):
        await lock.release()


# --- across processes: the lease in the backend -----------------------------------------------------------


async def test_lease_contract_acquire_release_and_growing_tokens(store: statekeel.Store) -> None:
    b = store.backend
    assert await b.read_session_lease("s") is None
    first = await b.acquire_session_lease("s", "A", 30)
    assert first.acquired and first.owner == "A" and first.token == 1
    refused = await b.acquire_session_lease("s", "B", 30)
    assert not refused.acquired and refused.owner == "A" and refused.token == 1
    assert await b.release_session_lease(first) is True
    assert await b.release_session_lease(first) is False  # already released
    second = await b.acquire_session_lease("s", "B", 30)
    assert second.acquired and second.token == 2
    with pytest.raises(statekeel.LeaseLost):
        await b.renew_session_lease(first, 30)
    renewed = await b.renew_session_lease(second, 60)
    assert renewed.token == 2 and renewed.expires_at > second.expires_at


async def test_expired_lease_is_taken_over_and_the_old_holders_writes_are_refused(
    store: statekeel.Store,
) -> None:
    b = store.backend
    await b.append_messages("s", 0, [message(store, "base")], create=True)
    old = await b.acquire_session_lease("s", "A", 0.05)
    async with asyncio.timeout(10):
        while not (new := await b.acquire_session_lease("s", "B", 30)).acquired:
            await asyncio.sleep(0.01)  # wait (with a deadline) for A's lease to expire
    assert new.token == old.token + 1
    with pytest.raises(statekeel.LeaseLost):
        await b.append_messages("s", 1, [message(store, "zombie")], lease=old)
    with pytest.raises(statekeel.LeaseLost):
        await b.update_session("s", metadata=b'{"zombie": true}', lease=old)
    with pytest.raises(statekeel.LeaseLost):
        await b.archive_messages(
            "s", compression_id="c", upto_seq=1, summary="z", expected_consolidated=0, lease=old
        )
    with pytest.raises(statekeel.LeaseLost):
        await b.delete_session("s", lease=old)
    rec = await b.load_session("s")
    assert rec is not None and rec.head_seq == 1 and rec.metadata == {} and rec.last_consolidated == 0
    await b.append_messages("s", 1, [message(store, "current holder")], lease=new)
    assert await contents(store, "s") == ["base", "current holder"]


def second_manager(store: statekeel.Store) -> SessionManager:
    """Another "process": its own manager (own owner id, cache and in-process locks) on the same database.

    (One in-memory database cannot be opened twice, so on every backend a second manager over the same
    backend stands in; real OS processes are in tests/reliability/test_sessions_processes.py.)
    """
    return SessionManager(store.backend, store.codec)


async def test_a_second_process_waits_for_the_holder_and_gets_the_session_after_release(
    store: statekeel.Store,
) -> None:
    mine = store.sessions
    theirs = second_manager(store)
    async with mine.open("s") as s:
        s.add_message("user", "first holder")
        with pytest.raises(statekeel.ConflictError) as info:
            await theirs.lock("s").acquire(timeout=0.2)
        assert info.value.holder == mine.owner_id
    async with asyncio.timeout(10), theirs.open("s", timeout=5) as s2:
        assert [m["content"] for m in s2.messages] == ["first holder"]
        s2.add_message("user", "second holder")
    assert await contents(store, "s") == ["first holder", "second holder"]


async def test_waiter_blocks_until_the_holder_releases(store: statekeel.Store) -> None:
    mine = store.sessions
    theirs = second_manager(store)
    order: list[str] = []
    lock = mine.lock("s")
    await lock.acquire()

    async def waiter() -> None:
        async with theirs.lock("s"):
            order.append("waiter in")

    task = asyncio.create_task(waiter())
    # Let the waiter poll a few times while the lease is held.
    async with asyncio.timeout(10):
        while (await store.backend.read_session_lease("s")) is None:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    order.append("holder out")
    await lock.release()
    async with asyncio.timeout(10):
        await task
    assert order == ["holder out", "waiter in"]


async def test_a_holder_whose_lease_was_taken_over_gets_lease_lost_on_save(store: statekeel.Store) -> None:
    mine = store.sessions
    mine.lease_seconds = 0.2
    theirs = second_manager(store)
    lock = mine.lock("s")
    await lock.acquire()
    s = await mine.get_or_create("s")
    # Simulate a holder that stalls (GC pause, suspended VM): its renewals stop, its lease expires.
    assert lock._renewer is not None
    lock._renewer.cancel()
    async with theirs.open("s", timeout=10) as other:
        other.add_message("user", "new holder")
    s.add_message("user", "zombie write")
    with pytest.raises(statekeel.LeaseLost):
        await mine.save(s)
    await lock.release()
    assert await contents(store, "s") == ["new holder"]


async def test_a_long_hold_is_renewed_and_never_taken_over(store: statekeel.Store) -> None:
    mine = store.sessions
    mine.lease_seconds = 0.3
    theirs = second_manager(store)
    async with mine.lock("s"):
        first = await store.backend.read_session_lease("s")
        assert first is not None
        async with asyncio.timeout(10):  # wait for at least three renewals, well past the first expiry
            while True:
                now = await store.backend.read_session_lease("s")
                assert now is not None
                if (now.expires_at - first.expires_at).total_seconds() >= 0.6:
                    break
                await asyncio.sleep(0.05)
        with pytest.raises(statekeel.ConflictError):
            await theirs.lock("s").acquire(timeout=0.1)
        assert now.token == first.token  # renewals keep the token


async def test_an_infinite_lease_is_refused_and_a_long_finite_one_is_usable(store: statekeel.Store) -> None:
    # Refused when the manager is made, not as an OverflowError from the lease write of the first lock.
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


@pytest.mark.kinds("sessions", "tool_calls", "transactions")
async def test_a_lock_taken_inside_an_atomic_block_keeps_renewing_its_lease_after_the_block(
    store: statekeel.Store,
) -> None:
    mine = store.sessions
    mine.lease_seconds = 0.3
    lock = mine.lock("s")
    async with store.backend.atomic():
        await lock.acquire()  # the lease is written in the caller's transaction; its renewals are not
    try:
        first = await store.backend.read_session_lease("s")
        assert first is not None and first.owner == mine.owner_id
        async with asyncio.timeout(10):  # renewed well past the first expiry, by its own transactions
            while True:
                now = await store.backend.read_session_lease("s")
                assert now is not None and now.token == first.token
                if (now.expires_at - first.expires_at).total_seconds() >= 0.6:
                    break
                await asyncio.sleep(0.05)
        with pytest.raises(statekeel.ConflictError):
            await second_manager(store).lock("s").acquire(timeout=0.1)
    finally:
        await lock.release()


async def test_a_lock_wait_that_times_out_says_the_session_is_busy_not_that_it_changed(
    store: statekeel.Store,
) -> None:
    mine = store.sessions
    theirs = second_manager(store)
    async with mine.lock("s"):
        with pytest.raises(statekeel.ConflictError) as across:  # still caught as a ConflictError
            await theirs.lock("s").acquire(timeout=0.05)
        with pytest.raises(statekeel.ConflictError) as within:  # another task of this process
            await asyncio.create_task(mine.lock("s").acquire(timeout=0.05))
    for info in (across, within):
        assert isinstance(info.value, statekeel.LockTimeout)
        assert info.value.key == "s"
        text = str(info.value)
        assert "changed it first" not in text and "reload" not in text
        assert "timeout" in text


def renewal_whose_answer_comes_with_the_cancellation(
    renew: Callable[..., Awaitable[Any]], started: asyncio.Event
) -> Callable[..., Awaitable[Any]]:
    """``renew`` (a backend's renewal write) whose answer arrives just as its task is cancelled: Python
    3.11's ``asyncio.wait_for`` (the NATS client's request, some database drivers) then returns the answer
    and the cancellation is lost. Each call waits for a cancellation and goes on with the write."""

    async def renewal(*args: Any, **kwargs: Any) -> Any:
        started.set()
        try:
            await asyncio.Event().wait()  # the answer is on its way
        except asyncio.CancelledError:
            pass  # ... and came with the cancellation, which wait_for dropped
        return await renew(*args, **kwargs)

    return renewal


async def held_while_a_renewal_is_on_its_way(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> tuple[statekeel.SessionLock, asyncio.Task[None]]:
    """A lock on "s" held under a short lease, returned once its renewal is on its way (whose answer will
    come with the cancellation): the lock and its renewer."""
    store.sessions.lease_seconds = 0.3
    renewing = asyncio.Event()
    hook = renewal_whose_answer_comes_with_the_cancellation(store.backend.renew_session_lease, renewing)
    monkeypatch.setattr(store.backend, "renew_session_lease", hook)
    lock = store.sessions.lock("s")
    await lock.acquire()
    renewer = lock.renewer
    assert renewer is not None
    async with asyncio.timeout(10):
        await renewing.wait()
    return lock, renewer


async def test_a_release_returns_and_frees_the_lease_when_the_renewal_it_stops_answers_anyway(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock, renewer = await held_while_a_renewal_is_on_its_way(store, monkeypatch)
    async with asyncio.timeout(10):  # never returned before: the renewer went on renewing
        await lock.release()
    assert renewer.done() and not lock.locked()
    theirs = second_manager(store).lock("s")
    await theirs.acquire(timeout=0)  # the lease was released, not left to expire
    await theirs.release()


async def test_closing_the_manager_returns_when_a_renewal_it_stops_answers_anyway(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = store.sessions
    _, renewer = await held_while_a_renewal_is_on_its_way(store, monkeypatch)
    async with asyncio.timeout(10):
        await mine.close()
    assert renewer.done()
