"""Usage on every backend: recorded with its message, checked before anything is added or written,
totalled per session and per model, a fork counting its prefix once, rewound turns not counted."""

from __future__ import annotations

import math
from typing import Any

import pytest

import statekeel
from statekeel.errors import InvalidArgument, NotFound


def u(model: str, i: int, o: int, cost: float) -> dict[str, Any]:
    return {"model": model, "input_tokens": i, "output_tokens": o, "cost": cost}


async def test_usage_is_stored_with_its_message_and_totalled_per_model(store: statekeel.Store) -> None:
    s = await store.sessions.get_or_create("s")
    s.add_message("user", "hi")
    s.add_message("assistant", "hello", usage=u("gpt-a", 10, 5, 0.25))
    s.add_item({"type": "message", "role": "assistant", "content": "x"}, usage=u("gpt-b", 3, 2, 0.5))
    s.add_message("assistant", "again", usage={"model": "gpt-a", "input_tokens": 7})
    await store.sessions.save(s)
    assert "usage" not in s.messages[1]  # not part of the message sent to a model
    total = await store.sessions.usage("s")
    assert isinstance(total, statekeel.Usage)
    assert (total.input_tokens, total.output_tokens, total.turns) == (20, 7, 3)
    assert math.isclose(total.cost, 0.75)
    assert set(total.by_model) == {"gpt-a", "gpt-b"}
    a = total.by_model["gpt-a"]
    assert (a.input_tokens, a.output_tokens, a.cost, a.turns) == (17, 5, 0.25, 2)


async def test_usage_survives_compression(store: statekeel.Store) -> None:
    s = await store.sessions.get_or_create("s")
    s.add_message("user", "q", usage=u("m", 1, 1, 0.0))
    s.add_message("assistant", "a", usage=u("m", 2, 2, 0.0))
    await store.sessions.save(s)
    await store.sessions.compress("s", 1, "summary")
    assert (await store.sessions.usage("s")).input_tokens == 3


async def test_a_fork_counts_its_prefix_once_and_a_rewind_uncounts_the_tail(store: statekeel.Store) -> None:
    s = await store.sessions.get_or_create("p")
    for i in range(4):
        s.add_message("assistant", f"m{i}", usage=u("m", 10, 1, 0.0))
    await store.sessions.save(s)
    f = await store.sessions.fork("p", 3, new_key="f")
    f.add_message("assistant", "f3", usage=u("n", 100, 0, 1.0))
    await store.sessions.save(f)
    fu = await store.sessions.usage("f")
    assert (fu.input_tokens, fu.turns) == (130, 4)
    assert fu.by_model["m"].turns == 3
    await store.sessions.compress("f", 2, "two")  # its archive now holds copies of m0, m1
    assert (await store.sessions.usage("f")).input_tokens == 130
    await store.sessions.delete("p")  # its part is copied into f
    assert (await store.sessions.usage("f")).input_tokens == 130
    await store.sessions.rewind("f", 3, reason="undo f3")
    assert (await store.sessions.usage("f")).input_tokens == 30


@pytest.mark.parametrize(
    "bad",
    [
        "gpt",
        {"input_tokens": 1},
        {"model": ""},
        {"model": 3},
        {"model": "m", "input_tokens": -1},
        {"model": "m", "output_tokens": 1.5},
        {"model": "m", "input_tokens": True},
        {"model": "m", "cost": float("nan")},
        {"model": "m", "cost": float("inf")},
        {"model": "m", "cost": -0.01},
        {"model": "m", "cost": "1"},
        {"model": "m", "tokens": 3},
    ],
)
async def test_bad_usage_is_refused_before_anything_is_added_or_written(
    store: statekeel.Store, bad: Any
) -> None:
    s = await store.sessions.get_or_create("s")
    s.add_message("user", "hi")
    with pytest.raises(InvalidArgument, match="usage"):
        s.add_message("assistant", "x", usage=bad)
    with pytest.raises(InvalidArgument, match="usage"):
        s.add_item({"role": "assistant", "content": "x"}, usage=bad)
    assert len(s.messages) == 1
    await store.sessions.save(s)
    assert (await store.sessions.usage("s")).turns == 0


async def test_usage_of_an_unknown_session_is_not_found(store: statekeel.Store) -> None:
    with pytest.raises(NotFound):
        await store.sessions.usage("nope")


async def test_message_usage_gives_each_turns_usage_by_seq_a_fork_its_parents_under_their_seqs(
    store: statekeel.Store,
) -> None:
    s = await store.sessions.get_or_create("p")
    s.add_message("user", "q")
    s.add_message("assistant", "a", usage=u("m", 10, 2, 0.5))
    s.add_message("assistant", "b", usage=u("n", 3, 1, 0.0))
    await store.sessions.save(s)
    assert await store.sessions.message_usage("p") == {
        1: statekeel.ModelUsage("m", 10, 2, 0.5, 1),
        2: statekeel.ModelUsage("n", 3, 1, 0.0, 1),
    }
    f = await store.sessions.fork("p", 2, new_key="f")
    f.add_message("assistant", "c", usage={"model": "m", "output_tokens": 4})
    await store.sessions.save(f)
    used = await store.sessions.message_usage("f")
    assert sorted(used) == [1, 2] and used[1].input_tokens == 10 and used[2].output_tokens == 4
    await store.sessions.compress("f", 2, "summary")  # compressed turns still count
    assert sorted(await store.sessions.message_usage("f")) == [1, 2]
    await store.sessions.rewind("p", 2, reason="undo b")  # rewound turns do not
    assert sorted(await store.sessions.message_usage("p")) == [1]
    with pytest.raises(NotFound):
        await store.sessions.message_usage("nobody")
