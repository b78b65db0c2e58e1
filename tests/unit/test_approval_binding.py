"""Approval binding: different argument values never share a hash, equal values always do (the canonical
encoding under key order, 1 / 1.0 / True, NUL, tagged look-alikes, Unicode forms, big ints)."""

from __future__ import annotations

import itertools
import unicodedata
from decimal import Decimal
from typing import Any

import pytest

import statekeel
from statekeel.approvals import ApprovalLog
from statekeel.audit import AuditLog
from statekeel.codec import Codec


def _log() -> ApprovalLog:
    codec = Codec()
    # args_hash needs neither the backend nor the audit log.
    return ApprovalLog(None, codec, AuditLog(None, codec))  # type: ignore[arg-type]


# Pairwise different values, several of which a sloppy encoding would merge.
DISTINCT: list[Any] = [
    1,
    1.0,
    True,
    "1",
    0,
    0.0,
    False,
    None,
    "",
    [],
    {},
    [1],
    {"a": 1},
    {"a": 1.0},
    {"a": True},
    {"a": "1"},
    "a\x00b",
    "YQBi",  # base64 of "a\x00b": what the NUL tag carries
    {"$sk": "nulstr", "v": "YQBi"},  # a user dict shaped like the tag
    2**70,
    str(2**70),
    {"$sk": "int", "v": str(2**70)},
    b"a",
    "YQ==",
    Decimal("1"),
    Decimal("1.0"),
    unicodedata.normalize("NFC", "é"),
    unicodedata.normalize("NFD", "é"),
    {"cmd": "rm -rf build"},
    {"cmd": "rm -rf /"},
    {"cmd": "rm -rf build", "sudo": False},
]


def test_different_argument_values_never_share_a_binding() -> None:
    log = _log()
    hashes = [log.args_hash(v) for v in DISTINCT]
    for (i, a), (j, b) in itertools.combinations(enumerate(hashes), 2):
        assert a != b, (DISTINCT[i], DISTINCT[j])


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ({"b": 1, "a": [2, {"y": 1, "x": 2}]}, {"a": [2, {"x": 2, "y": 1}], "b": 1}),
        ((1, "x"), [1, "x"]),  # stored alike: the codec keeps tuples as lists
        (b"ab", bytearray(b"ab")),
    ],
)
def test_equal_argument_values_always_share_a_binding(one: Any, other: Any) -> None:
    log = _log()
    assert log.args_hash(one) == log.args_hash(other)
    assert log.args_hash(one) == log.args_hash(one)


def test_unstorable_arguments_raise_a_typed_error() -> None:
    log = _log()
    for bad in ({1: "x"}, {"a": float("nan")}, {"a\x00": 1}, {"s": {1, 2}}, "\ud800"):
        with pytest.raises(statekeel.SerializationError):
            log.args_hash(bad)


@pytest.mark.parametrize(
    "kind", ["approval.granted", "approval.consumed", "approval.note", "APPROVAL.denied", "Approval.x"]
)
async def test_audit_append_refuses_an_approval_kind_and_writes_nothing(
    store: statekeel.Store, kind: str
) -> None:
    approval = await store.approvals.request("task:1", "shell", {"cmd": "ls"}, "agent")
    before = (await store.audit.verify()).count
    with pytest.raises(statekeel.InvalidKey, match="reserved"):
        await store.audit.append(kind, "app", "task:1", {"approval_id": approval.id})
    assert (await store.audit.verify()).count == before
    await store.audit.append("app.approval_note", "app", "task:1", {"approval_id": approval.id})


@pytest.mark.parametrize("kind", ["approval.note", "Approval.consumed", "APPROVAL.DENIED"])
async def test_an_entry_of_a_kind_statekeel_does_not_write_never_disables_an_approval(
    store: statekeel.Store, kind: str
) -> None:
    """An entry naming the approval (written before append refused such kinds, or straight through the
    backend) is not the approval's latest change, on every backend: check, consume and verify ignore it."""
    approval = await store.approvals.request("task:1", "shell", {"cmd": "ls"}, "agent")
    await store.approvals.decide(approval.id, True, "alice")
    data = store.audit.encode_data({"approval_id": approval.id})
    await store.backend.append_audit(kind, "app", "task:1", data)
    found = await store.approvals.check("task:1", "shell", {"cmd": "ls"})
    assert found is not None and found.id == approval.id
    report = await store.audit.verify()
    assert report.ok and report.approvals == 1, report.reason
    consumed = await store.approvals.consume(approval.id, "agent")
    assert consumed.consumed_by == "agent"
    assert (await store.audit.verify()).ok
