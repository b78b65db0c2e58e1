"""The session part of the storage contract, on every backend."""

from __future__ import annotations

import pytest

import statekeel
from statekeel.backends.base import NewMessage


def _msg(store: statekeel.Store, role: str, content: str) -> NewMessage:
    return NewMessage(role, store.codec.encode({"role": role, "content": content}))


async def test_append_assigns_dense_sequence_numbers(store: statekeel.Store) -> None:
    b = store.backend
    rec = await b.append_messages(
        "s", 0, [_msg(store, "user", "a"), _msg(store, "assistant", "b")], create=True
    )
    assert rec.head_seq == 2
    rec = await b.append_messages("s", 2, [_msg(store, "user", "c")])
    assert rec.head_seq == 3
    rows = await b.read_messages("s")
    assert [(r.seq, r.payload["content"]) for r in rows] == [(0, "a"), (1, "b"), (2, "c")]


async def test_append_at_stale_head_raises_conflict_with_current_head(store: statekeel.Store) -> None:
    b = store.backend
    await b.append_messages("s", 0, [_msg(store, "user", "a")], create=True)
    with pytest.raises(statekeel.ConflictError) as info:
        await b.append_messages("s", 0, [_msg(store, "user", "b")])
    assert info.value.current == 1
    assert [r.payload["content"] for r in await b.read_messages("s")] == ["a"]
