"""Approvals: exact-argument binding, decided once, consumed once, each event audited in its transaction."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

import statekeel
from helpers import BAD_TEXT, granted_approval

Store = statekeel.Store
ARGS = {"cmd": "rm", "paths": ["build/"], "force": True}


async def test_a_granted_approval_authorizes_exactly_its_arguments(store: Store) -> None:
    approval = await granted_approval(store, "task:42", ARGS, "agent-7")
    assert (approval.status, approval.decided_by, approval.reason) == ("granted", "alice", "build dir only")
    found = await store.approvals.check("task:42", "shell", {"force": True, "paths": ["build/"], "cmd": "rm"})
    assert found is not None and found.id == approval.id  # key order does not matter
    for other in (
        {"cmd": "rm", "paths": ["/"], "force": True},
        {"cmd": "rm", "paths": ["build/"]},
        {"cmd": "rm", "paths": ["build/"], "force": 1},
    ):
        assert await store.approvals.check("task:42", "shell", other) is None
    assert await store.approvals.check("task:43", "shell", ARGS) is None
    assert await store.approvals.check("task:42", "python", ARGS) is None


async def test_an_approval_is_consumed_once(store: Store) -> None:
    approval = await granted_approval(store, "task:42", ARGS, "agent-7")
    used = await store.approvals.consume(approval.id, "agent-7")
    assert used.consumed_by == "agent-7" and used.consumed_at is not None
    with pytest.raises(statekeel.ConflictError, match="already consumed"):
        await store.approvals.consume(approval.id, "agent-8")
    assert await store.approvals.check("task:42", "shell", ARGS) is None


async def test_racing_consumers_get_the_approval_once(store: Store) -> None:
    approval = await granted_approval(store, "task:42", ARGS, "agent-7")
    outcomes = await asyncio.gather(
        *(store.approvals.consume(approval.id, f"agent-{i}") for i in range(5)), return_exceptions=True
    )
    assert sum(isinstance(o, statekeel.Approval) for o in outcomes) == 1
    assert sum(isinstance(o, statekeel.ConflictError) for o in outcomes) == 4
    assert len(await store.audit.query(kind="approval.consumed")) == 1


async def test_an_approval_is_decided_once(store: Store) -> None:
    approval = await granted_approval(store, "task:42", ARGS, "agent-7")
    with pytest.raises(statekeel.ConflictError, match="already granted"):
        await store.approvals.decide(approval.id, False, "bob")
    assert (await store.approvals.get(approval.id)) == approval


async def test_pending_or_denied_approvals_authorize_nothing(store: Store) -> None:
    pending = await store.approvals.request("s", "a", {"x": 1}, "agent")
    assert await store.approvals.check("s", "a", {"x": 1}) is None
    with pytest.raises(statekeel.InvalidTransition, match="pending"):
        await store.approvals.consume(pending.id, "agent")
    denied = await store.approvals.decide(pending.id, False, "alice", reason="no")
    assert denied.status == "denied"
    assert await store.approvals.check("s", "a", {"x": 1}) is None
    with pytest.raises(statekeel.InvalidTransition, match="denied"):
        await store.approvals.consume(pending.id, "agent")


async def test_an_expired_approval_cannot_be_decided_checked_or_consumed(store: Store) -> None:
    past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    hashed = store.approvals.args_hash(ARGS)
    raw = store.codec.encode(ARGS)
    # Expired by the time it is used: written directly, since request() refuses a past expiry.
    stale = await store.backend.create_approval(
        "stale", subject="s", action="a", args=raw, args_hash=hashed, requested_by="x", expires_at=past
    )
    with pytest.raises(statekeel.InvalidTransition, match="expired"):
        await store.approvals.decide(stale.id, True, "alice")
    assert await store.approvals.pending() == []
    granted = await granted_approval(store, "task:42", ARGS, "agent-7")
    assert await store.approvals.check("task:42", "shell", ARGS) == granted


async def test_pending_lists_undecided_approvals_oldest_first(store: Store) -> None:
    a = await store.approvals.request("s", "a", 1, "x")
    b = await store.approvals.request(
        "s", "a", 2, "x", expires_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    )
    await granted_approval(store, "task:42", ARGS, "agent-7")
    assert [p.id for p in await store.approvals.pending()] == [a.id, b.id]


async def test_each_approval_event_appends_its_audit_entry(store: Store) -> None:
    approval = await granted_approval(store, "task:42", ARGS, "agent-7")
    await store.approvals.consume(approval.id, "agent-7")
    entries = await store.audit.query(subject="task:42")
    assert [(e.kind, e.actor) for e in entries] == [
        ("approval.requested", "agent-7"),
        ("approval.granted", "alice"),
        ("approval.consumed", "agent-7"),
    ]
    assert all(e.data["approval_id"] == approval.id for e in entries)
    assert all(e.data["args_hash"] == approval.args_hash for e in entries)
    assert (await store.audit.verify()).ok


async def test_bad_approval_input_raises_typed_errors_and_writes_nothing(store: Store) -> None:
    with pytest.raises(statekeel.NotFound):
        await store.approvals.decide("no-such-approval", True, "alice")
    with pytest.raises(statekeel.NotFound):
        await store.approvals.consume("no-such-approval", "agent")
    with pytest.raises(statekeel.SerializationError, match=r"args\.when"):
        await store.approvals.request("s", "a", {"when": object()}, "agent")
    with pytest.raises(statekeel.InvalidArgument):
        await store.approvals.request("s", "a", {}, "agent", expires_at=dt.datetime.now(dt.UTC))
    with pytest.raises(statekeel.InvalidArgument):
        await store.approvals.request("", "a", {}, "agent")
    with pytest.raises(statekeel.SerializationError):
        await store.approvals.check("s", "a", {1, 2})
    approval = await store.approvals.request("s", "a", {}, "agent")
    with pytest.raises(statekeel.InvalidArgument):
        await store.approvals.decide(approval.id, "yes", "alice")  # type: ignore[arg-type]
    assert await store.approvals.pending() == [approval]
    assert [e.kind for e in await store.audit.query()] == ["approval.requested"]


@pytest.mark.parametrize("text", BAD_TEXT, ids=["nul", "surrogate"])
async def test_a_decision_reason_with_nul_or_a_surrogate_is_refused_and_nothing_written(
    store: Store, text: str
) -> None:
    approval = await store.approvals.request("task:1", "shell", {"cmd": "ls"}, "agent")
    before = await store.audit.verify()
    with pytest.raises(statekeel.InvalidArgument):
        await store.approvals.decide(approval.id, True, "alice", reason=text)
    assert await store.approvals.get(approval.id) == approval
    assert await store.audit.verify() == before
    granted = await store.approvals.decide(approval.id, True, "alice", reason="ok")
    assert granted.status == "granted" and granted.reason == "ok"
