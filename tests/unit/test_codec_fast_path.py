"""The codec's fast path: plain JSON goes straight to orjson, and gives exactly what the full walk gives.

``Codec.encode`` first checks whether a value is plain JSON with nothing to tag; only then does it skip the
walk that rebuilds the value. These tests pin that the shortcut never changes a byte and never lets through
a value that needs a tag or must be refused.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from decimal import Decimal
from typing import Any

import orjson
import pytest

from statekeel.codec import Codec
from statekeel.errors import SerializationError


class Color(enum.IntEnum):
    RED = 1


class Mode(enum.StrEnum):
    FAST = "fast"


PLAIN: list[Any] = [
    {"role": "user", "content": "hello"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
    },
    [1, 2.5, True, False, None, "x", [], {}],
    {"nested": {"deeper": [{"a": [1, [2, [3]]]}]}},
    "just a string",
    42,
    -(2**63),
    2**63 - 1,
    0.1,
    ("a", "tuple"),
    {"unicode": "héllo ✓ \U0001f600", "escapes": 'quote " backslash \\ newline \n'},
]


@pytest.mark.parametrize("value", PLAIN)
def test_plain_values_encode_to_the_same_bytes_as_the_full_walk(value: Any) -> None:
    codec = Codec()
    assert codec.encode(value) == orjson.dumps(codec.to_json(value))
    expected = [*value] if isinstance(value, tuple) else value
    assert codec.decode(codec.encode(value)) == expected


NEEDS_TAG: list[Any] = [
    {"deep": [{"text": "nul \x00 inside"}]},
    {"n": [2**64]},
    {"when": [dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)]},
    {"id": uuid.UUID(int=7)},
    {"color": Color.RED},
    {"mode": [Mode.FAST]},
    {"amount": Decimal("1.10")},
    {"blob": [b"\x00\x01"]},
    {"$sk": "user data that looks like a tag"},
    {"outer": {"$sk": "dict", "v": {}}},
]


def _types(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value)


@pytest.mark.parametrize("value", NEEDS_TAG)
def test_values_that_need_a_tag_round_trip_exactly_with_their_types(value: Any) -> None:
    codec = Codec()
    raw = codec.encode(value)
    assert b'"$sk"' in raw
    back = codec.decode(raw)
    assert back == value
    assert _types(back) == _types(value)  # IntEnum == int, so equality alone would not catch a lost type


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"scores": [1.0, float("nan")]}, "scores[1]"),
        ({"a": {"b": float("inf")}}, "a.b"),
        ({"keys": {1: "int key"}}, "keys"),
        ({"s": [{1, 2}]}, "s[0]"),
        ({"bad\x00key": 1}, "<root>"),
    ],
)
def test_nested_bad_values_are_refused_with_their_path(value: Any, path: str) -> None:
    with pytest.raises(SerializationError) as info:
        Codec().encode(value)
    assert info.value.path == path


def _nest(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [3, 4, 5, 6])
def test_depth_limit_is_the_same_with_and_without_the_fast_path(depth: int) -> None:
    codec = Codec(max_depth=5)
    try:
        slow: bytes | None = codec.dumps_json(codec.to_json(_nest(depth)))
    except SerializationError:
        slow = None
    if slow is None:
        with pytest.raises(SerializationError):
            codec.encode(_nest(depth))
    else:
        assert codec.encode(_nest(depth)) == slow
