"""The wall clock stepping backwards (an NTP correction, a VM restored from a snapshot), on every backend.

Order never comes from timestamps: a session's messages stay in sequence order, the audit chain in seq
order and verifiable, and a worker whose clock went back is still fenced by its lease epoch once its task
was taken over. What the clock does decide — lease and approval expiry — follows the clock of the
process that writes (docs/reliability.md says what that costs).
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable

import pytest

import statekeel

CLOCKS = ("utcnow", "_utcnow")


def step_clock(monkeypatch: pytest.MonkeyPatch, delta: dt.timedelta) -> None:
    """Shift every clock statekeel reads (each module's ``utcnow`` / ``_utcnow``) by ``delta``."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("statekeel"):
            continue
        for attr in CLOCKS:
            clock = getattr(module, attr, None)
            if callable(clock) and getattr(clock, "__module__", "").startswith("statekeel"):
                monkeypatch.setattr(module, attr, _shifted(clock, delta))


def _shifted(clock: Callable[[], dt.datetime], delta: dt.timedelta) -> Callable[[], dt.datetime]:
    def shifted() -> dt.datetime:
        return clock() + delta

    shifted.__module__ = "statekeel.tests.clock"
    return shifted


HOUR = dt.timedelta(hours=1)


async def test_messages_stay_in_sequence_order_when_the_clock_steps_back(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await store.sessions.get_or_create("agent")
    for i in range(3):
        session.add_message("user", f"before {i}")
        await store.sessions.save(session)
    step_clock(monkeypatch, -HOUR)
    for i in range(3):
        session.add_message("user", f"after {i}")
        await store.sessions.save(session)
    rows = await store.backend.read_messages("agent")
    assert [r.seq for r in rows] == list(range(6))
    assert rows[3].created_at < rows[2].created_at  # the clock did step back
    loaded = await store.sessions.load("agent")
    assert loaded is not None
    assert [m["content"] for m in loaded.messages] == [f"before {i}" for i in range(3)] + [
        f"after {i}" for i in range(3)
    ]


async def test_the_audit_chain_verifies_when_entries_go_back_in_time(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.audit.append("tool.call", "agent", "task:1", {"n": 1})
    step_clock(monkeypatch, -HOUR)
    await store.audit.append("tool.call", "agent", "task:1", {"n": 2})
    entries = await store.audit.query()
    assert [e.seq for e in entries] == [1, 2] and entries[1].created_at < entries[0].created_at
    assert (await store.audit.verify()).ok


async def test_a_worker_whose_clock_stepped_back_is_fenced_once_its_task_was_taken_over(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await store.tasks.create("deploy", status="queued")
    step_clock(monkeypatch, -HOUR)  # the worker's clock is an hour behind
    zombie = await store.tasks.claim("zombie", lease_seconds=60)
    assert zombie is not None and zombie.id == task.id
    monkeypatch.undo()  # another process, with the right time, finds the lease long expired
    assert [t.id for t in await store.tasks.expire_leases()] == [task.id]
    await store.tasks.transition(task.id, "queued")
    heir = await store.tasks.claim("heir", lease_seconds=60)
    assert heir is not None and heir.lease_epoch == zombie.lease_epoch + 1
    step_clock(monkeypatch, -HOUR)  # by its own clock the zombie's lease still runs: the epoch decides
    calls: list[int] = []
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.heartbeat(task.id, "zombie", zombie.lease_epoch)
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.step(task.id, "send", lambda: calls.append(1), lease_epoch=zombie.lease_epoch)
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.transition(task.id, "success", worker_id="zombie", lease_epoch=zombie.lease_epoch)
    assert calls == []
    monkeypatch.undo()
    done = await store.tasks.transition(task.id, "success", worker_id="heir", lease_epoch=heir.lease_epoch)
    assert done.status == "success"
