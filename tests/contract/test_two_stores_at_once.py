"""Two stores (two connections, as two processes have) on one database, deciding on the same state at
once: audit appends after the same head, and session leases taken, renewed and released against each
other. Exactly one of two writes decided on one state lands; the other decides again on what it finds.

One store serialises its own audit appends and its own lease changes, so only the engine's conditional
write keeps two stores apart. On NATS that is a publish conditional on the sequence read (the audit
stream's last sequence, the lease entry's revision), and between the read and the publish there is a gap:
:class:`BothReadFirst` holds each store's first publish to the stream until both stores have reached
theirs, so both have read the same state and neither has written yet. The SQL engines decide and write in
one transaction (locked rows, one conditional statement): there the two stores simply run at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import statekeel
from statekeel.audit import GENESIS_HASH
from statekeel.backends.base import SessionLease
from statekeel.backends.composite import CompositeBackend
from statekeel.backends.nats.audit import audit_spec
from statekeel.backends.nats.lease_entries import leases_spec

Store = statekeel.Store


def nats_engine(store: Store, kind: str) -> Any | None:
    """The NATS backend holding ``kind`` in ``store`` (plain or paired), or None on the SQL engines."""
    backend: Any = store.backend
    if isinstance(backend, CompositeBackend):
        backend = backend.front if kind in backend.front_kinds else backend.rest
    return backend if type(backend).__name__ == "NatsBackend" else None


class BothReadFirst:
    """Holds each store's first publish to one NATS stream until every store has reached its own, then
    lets them go one at a time, in the order the stores are given (each after the one before it was
    answered): all have read, then all write, the first store's write landing first. That is the
    interleaving a compare-and-swap is for, in the order that a blind write would get wrong. ``met``
    counts the publishes held; on the SQL engines nothing is held and it stays 0."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        stores: tuple[Store, ...],
        kind: str,
        stream: Callable[[str], str],
    ) -> None:
        self.met = 0
        self.forced = False
        self._all_read = asyncio.Event()
        self._written = [asyncio.Event() for _ in stores]
        for place, store in enumerate(stores):
            engine = nats_engine(store, kind)
            if engine is None:
                continue
            self.forced = True
            self._hold(monkeypatch, engine.conn, stream(engine.prefix), place, len(stores))

    def _hold(self, monkeypatch: pytest.MonkeyPatch, conn: Any, name: str, place: int, stores: int) -> None:
        publish = conn.publish
        first = True

        async def held(subject: str, payload: bytes, *, stream: str, **kwargs: Any) -> Any:
            nonlocal first
            if not first or stream != name:
                return await publish(subject, payload, stream=stream, **kwargs)
            first = False
            self.met += 1
            if self.met == stores:
                self._all_read.set()
            try:
                async with asyncio.timeout(10):  # another store never got to its write: fail, not hang
                    await self._all_read.wait()
                    if place:
                        await self._written[place - 1].wait()
                return await publish(subject, payload, stream=stream, **kwargs)
            finally:
                self._written[place].set()

        monkeypatch.setattr(conn, "publish", held)

    def check(self) -> None:
        """The interleaving happened where it was forced."""
        assert self.met == (len(self._written) if self.forced else 0)


def audit_stream(prefix: str) -> str:
    return audit_spec(prefix).name


def leases_stream(prefix: str) -> str:
    return leases_spec(prefix).name


@pytest.fixture
async def other(store_url: str) -> Any:
    """A second store on the store's database: its own connection, manager and owner id."""
    if store_url == "memory://":
        pytest.skip("an in-memory store cannot be opened twice: one store serialises itself")
    async with statekeel.open_store(store_url) as second:
        yield second


# --- the audit chain ----------------------------------------------------------------------------------------


@pytest.mark.kinds("audit")
async def test_two_stores_appending_after_the_same_head_chain_one_entry_after_the_other(
    store: Store, other: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await store.audit.append("setup", "a", "s", {"n": 0})
    gate = BothReadFirst(monkeypatch, (store, other), "audit", audit_stream)
    mine, theirs = await asyncio.gather(
        store.audit.append("k", "mine", "s", {"n": 1}), other.audit.append("k", "theirs", "s", {"n": 2})
    )
    gate.check()
    assert sorted((mine.seq, theirs.seq)) == [2, 3]  # neither overwrote nor forked after the head
    second, third = sorted((mine, theirs), key=lambda e: e.seq)
    assert second.prev_hash == first.hash and third.prev_hash == second.hash
    for s in (store, other):
        report = await s.audit.verify()
        assert report.ok and report.count == 3, report
        entries = await s.audit.query()
        assert [(e.seq, e.actor) for e in entries] == [(1, "a"), (second.seq, second.actor), (3, third.actor)]


@pytest.mark.kinds("audit")
async def test_two_stores_appending_the_first_entries_of_an_empty_chain_never_both_start_it(
    store: Store, other: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = BothReadFirst(monkeypatch, (store, other), "audit", audit_stream)
    entries = await asyncio.gather(
        store.audit.append("k", "mine", "s", {"n": 1}), other.audit.append("k", "theirs", "s", {"n": 2})
    )
    gate.check()
    first, second = sorted(entries, key=lambda e: e.seq)
    assert (first.seq, second.seq) == (1, 2)
    assert first.prev_hash == GENESIS_HASH and second.prev_hash == first.hash
    assert (await other.audit.verify()).ok


# --- session leases ---------------------------------------------------------------------------------------


@pytest.mark.kinds("sessions")
async def test_two_stores_taking_a_free_session_lease_at_once_give_it_to_one(
    store: Store, other: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = BothReadFirst(monkeypatch, (store, other), "sessions", leases_stream)
    mine, theirs = await asyncio.gather(
        store.backend.acquire_session_lease("s", "A", 30), other.backend.acquire_session_lease("s", "B", 30)
    )
    gate.check()
    assert [mine.acquired, theirs.acquired].count(True) == 1, (mine, theirs)
    winner = mine if mine.acquired else theirs
    loser = theirs if mine.acquired else mine
    assert (loser.owner, loser.token) == (winner.owner, winner.token)  # it names who has it
    for s in (store, other):
        held = await s.backend.read_session_lease("s")
        assert held is not None and (held.owner, held.token) == (winner.owner, winner.token)


@pytest.mark.kinds("sessions")
async def test_two_stores_taking_over_the_same_lease_at_once_give_it_to_one(
    store: Store, other: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await store.backend.acquire_session_lease("s", "gone", 30)
    gate = BothReadFirst(monkeypatch, (store, other), "sessions", leases_stream)
    mine, theirs = await asyncio.gather(
        store.backend.acquire_session_lease("s", "A", 30, take_over=old),
        other.backend.acquire_session_lease("s", "B", 30, take_over=old),
    )
    gate.check()
    assert [mine.acquired, theirs.acquired].count(True) == 1, (mine, theirs)
    winner = mine if mine.acquired else theirs
    assert winner.token == old.token + 1
    loser = theirs if mine.acquired else mine
    assert (loser.owner, loser.token) == (winner.owner, winner.token)  # it names who has it
    held = await other.backend.read_session_lease("s")
    assert held is not None and (held.owner, held.token) == (winner.owner, winner.token)


@pytest.mark.kinds("sessions")
async def test_a_renewal_decided_before_a_takeover_and_written_after_it_is_refused(
    store: Store, other: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = await store.backend.acquire_session_lease("s", "A", 30)
    # On NATS: both read A's lease, then B's takeover lands, then A's renewal is written.
    gate = BothReadFirst(monkeypatch, (other, store), "sessions", leases_stream)
    takeover, renewal = await asyncio.gather(
        other.backend.acquire_session_lease("s", "B", 30, take_over=held),
        store.backend.renew_session_lease(held, 60),
        return_exceptions=True,
    )
    gate.check()
    # A takeover names the lease by holder and token, which a renewal keeps: it lands in either order.
    assert isinstance(takeover, SessionLease) and takeover.acquired, takeover
    assert isinstance(renewal, (SessionLease, statekeel.LeaseLost)), renewal
    now = await store.backend.read_session_lease("s")
    assert now is not None and (now.owner, now.token) == ("B", held.token + 1), now  # never A's again
    assert now.expires_at == takeover.expires_at
    with pytest.raises(statekeel.LeaseLost):
        await store.backend.renew_session_lease(held, 60)


@pytest.mark.kinds("sessions")
async def test_a_release_decided_before_a_takeover_never_frees_the_lease_it_gave_away(
    store: Store, other: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = await store.backend.acquire_session_lease("s", "A", 30)
    # On NATS: both read A's lease, then B's takeover lands, then A's release is written.
    gate = BothReadFirst(monkeypatch, (other, store), "sessions", leases_stream)
    takeover, released = await asyncio.gather(
        other.backend.acquire_session_lease("s", "B", 30, take_over=held),
        store.backend.release_session_lease(held),
    )
    gate.check()
    assert released != takeover.acquired, (released, takeover)  # one of them, never both
    now = await store.backend.read_session_lease("s")
    if takeover.acquired:
        assert now is not None and (now.owner, now.token) == ("B", held.token + 1), now
    else:  # released first: the lease is free, for anyone to take with a new token
        taken = await other.backend.acquire_session_lease("s", "B", 30)
        assert taken.acquired and taken.token == held.token + 1


async def _hold_until(lock: Any, leave: asyncio.Event) -> statekeel.ConflictError | None:
    """Take ``lock`` (one task takes and releases it) and hold it until ``leave``; the refusal if the
    lock was not had within its timeout."""
    try:
        await lock.acquire(timeout=0.3)
    except statekeel.ConflictError as refused:
        return refused
    try:
        await leave.wait()
    finally:
        await lock.release()
    return None


@pytest.mark.kinds("sessions")
async def test_two_stores_locking_one_session_at_once_let_one_in_and_tell_the_other_who_holds_it(
    store: Store, other: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = BothReadFirst(monkeypatch, (store, other), "sessions", leases_stream)
    leave = asyncio.Event()
    tries = [asyncio.create_task(_hold_until(s.sessions.lock("s"), leave)) for s in (store, other)]
    # The one refused returns at its lock timeout; the one inside holds on until told to leave.
    done, _ = await asyncio.wait(tries, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    leave.set()
    async with asyncio.timeout(10):
        outcomes = [await t for t in tries]
    gate.check()
    assert done, "both stores got into the session's lock"
    assert [o is None for o in outcomes].count(True) == 1, outcomes
    inside = outcomes.index(None)
    refused = outcomes[1 - inside]
    assert isinstance(refused, statekeel.ConflictError), refused
    assert refused.holder == (store, other)[inside].sessions.owner_id
    async with asyncio.timeout(10), (store, other)[1 - inside].sessions.open("s", timeout=5):
        pass  # released: the other store gets it now
