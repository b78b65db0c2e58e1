"""The codec: exact round trips of registered types, refusals that name the bad value's path, limits."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import math
import timeit
import uuid
from decimal import Decimal
from typing import Any

import orjson
import pytest

import statekeel
from helpers import FLOATS, same_value
from statekeel.codec import TAG, Codec, canonical
from statekeel.errors import InvalidArgument, PayloadTooLarge, SerializationError


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mode(enum.StrEnum):
    FAST = "fast"
    SAFE = "safe"


@dataclasses.dataclass
class ToolCall:
    name: str
    args: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Turn:
    at: dt.datetime
    calls: list[ToolCall]
    color: Color


def roundtrip(value: Any, codec: Codec | None = None) -> Any:
    codec = codec or Codec()
    return codec.decode(codec.encode(value))


def assert_same(a: Any, b: Any) -> None:
    """Equal and of the same type, recursively (1 == 1.0 == True must not pass)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b
        if isinstance(a, dt.datetime | dt.time):
            assert a.tzinfo == b.tzinfo


UTC = dt.UTC
PLUS_5_30 = dt.timezone(dt.timedelta(hours=5, minutes=30))


@pytest.mark.parametrize(
    "value",
    [
        dt.datetime(2026, 3, 1, 12, 30, 45, 123456, tzinfo=UTC),
        dt.datetime(2026, 3, 1, 12, 30, 45, 1, tzinfo=PLUS_5_30),
        dt.datetime(1999, 12, 31, 23, 59, 59),  # naive stays naive
        dt.date(2026, 2, 28),
        dt.time(23, 59, 59, 999999),
        dt.time(8, 0, tzinfo=PLUS_5_30),
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        Decimal("3.14159265358979323846264338327950288"),
        Decimal("-0.000"),
        b"\x00\x01\xff binary",
        b"",
        Color.BLUE,
        Level.HIGH,
        Mode.SAFE,
        2**64 + 1,
        -(2**100),
        2**63 - 1,
        -(2**63),
        "nul \x00 inside",
        "unicode ✓ 𝄞",
        {"$sk": "not a tag", "other": 1},
        {"nested": {"$sk": {"$sk": "deeper"}}},
        [1, 2.5, True, None, "x"],
        {},
        [],
    ],
    ids=lambda v: f"{type(v).__name__}",
)
def test_registered_types_round_trip_exactly(value: Any) -> None:
    assert_same(roundtrip(value), value)


def test_nested_and_frozen_dataclasses_round_trip_exactly() -> None:
    turn = Turn(
        at=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        calls=[ToolCall("pytest", {"k": b"\x00", "when": dt.date(2026, 1, 2)}), ToolCall("ls", {})],
        color=Color.RED,
    )
    back = roundtrip({"turn": turn})["turn"]
    assert type(back) is Turn
    assert back == turn
    assert type(back.calls[0]) is ToolCall and back.calls[0].args["k"] == b"\x00"
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.color = Color.BLUE  # type: ignore[misc]


def test_enum_members_come_back_as_the_same_member() -> None:
    back = roundtrip([Color.RED, Level.LOW, Mode.FAST])
    assert back[0] is Color.RED and back[1] is Level.LOW and back[2] is Mode.FAST


def test_user_dict_with_reserved_key_is_returned_unchanged() -> None:
    value = {"$sk": "bytes", "v": "AAEC"}  # looks exactly like a tagged value
    assert roundtrip(value) == value
    assert roundtrip([{"$sk": "datetime", "v": "2026-01-01"}]) == [{"$sk": "datetime", "v": "2026-01-01"}]


def test_tuples_are_stored_as_lists() -> None:
    assert roundtrip({"t": (1, "a")}) == {"t": [1, "a"]}


def test_plain_json_encodes_to_plain_json_bytes() -> None:
    raw = Codec().encode({"role": "user", "content": "hi", "n": 3})
    assert json.loads(raw) == {"role": "user", "content": "hi", "n": 3}
    assert TAG.encode() not in raw


def _path_of(value: Any, where: str = "") -> str:
    with pytest.raises(SerializationError) as info:
        Codec().encode(value, where=where)
    assert isinstance(info.value, InvalidArgument)
    return str(info.value.path)


def message_list_with(bad: Any) -> dict[str, Any]:
    messages: list[Any] = [{"content": "ok"} for _ in range(3)]
    messages.append({"content": {"foo": bad}})
    return {"messages": messages}


@pytest.mark.parametrize(
    "bad",
    [
        lambda: None,
        print,
        {1, 2},
        frozenset({"a"}),
        float("nan"),
        float("inf"),
        float("-inf"),
        Decimal("NaN"),
        object(),
        type("Custom", (), {})(),
        ToolCall,  # a class, not an instance
    ],
    ids=[
        "lambda",
        "builtin",
        "set",
        "frozenset",
        "nan",
        "inf",
        "-inf",
        "decimal-nan",
        "object",
        "custom",
        "class",
    ],
)
def test_unsupported_values_raise_serialization_error_naming_their_path(bad: Any) -> None:
    assert _path_of(message_list_with(bad)) == "messages[3].content.foo"


def test_non_string_dict_keys_are_refused_with_the_path_of_the_dict() -> None:
    with pytest.raises(SerializationError) as info:
        Codec().encode(message_list_with({1: "x"}))
    assert info.value.path == "messages[3].content.foo"
    assert "1" in str(info.value)


def test_path_starts_with_the_callers_location() -> None:
    assert _path_of({"content": {1, 2}}, where="messages[7]") == "messages[7].content"


def test_bad_value_inside_a_dataclass_is_refused() -> None:
    with pytest.raises(SerializationError):
        Codec().encode(ToolCall("x", {"s": {1}}))


def test_subclasses_of_builtin_types_are_refused_not_coerced() -> None:
    class MyStr(str):
        pass

    with pytest.raises(SerializationError):
        Codec().encode({"a": MyStr("x")})


def test_record_over_the_size_limit_raises_payload_too_large() -> None:
    codec = Codec(max_record_bytes=1000)
    codec.encode("x" * 900)
    with pytest.raises(PayloadTooLarge) as info:
        codec.encode("x" * 1000)
    assert info.value.limit == 1000
    assert info.value.size > 1000
    assert isinstance(info.value, InvalidArgument)


def test_default_size_limit_is_16_mib() -> None:
    codec = Codec()
    assert codec.max_record_bytes == 16 * 1024 * 1024
    with pytest.raises(PayloadTooLarge):
        codec.encode("x" * (16 * 1024 * 1024))


def test_nesting_beyond_the_depth_limit_is_refused() -> None:
    codec = Codec(max_depth=10)
    ok: Any = "leaf"
    for _ in range(9):
        ok = [ok]
    codec.encode(ok)
    too_deep: Any = "leaf"
    for _ in range(11):
        too_deep = {"a": too_deep}
    with pytest.raises(SerializationError) as info:
        codec.encode(too_deep)
    assert "deeper than 10" in str(info.value)


def test_self_referencing_structure_is_refused_not_a_crash() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(SerializationError):
        Codec().encode(loop)


@pytest.mark.parametrize("raw", [b"", b"{", b"\xff\xfe", b"[1,]", b"NaN", "{'a': 1}"])
def test_decoding_garbage_raises_serialization_error(raw: bytes | str) -> None:
    with pytest.raises(SerializationError):
        Codec().decode(raw)


def test_decoding_an_unknown_tag_raises_serialization_error() -> None:
    with pytest.raises(SerializationError):
        Codec().decode(b'{"$sk": "no-such-type", "v": 1}')


def test_bad_limits_are_refused() -> None:
    with pytest.raises(InvalidArgument):
        Codec(max_record_bytes=0)
    with pytest.raises(InvalidArgument):
        Codec(max_depth=-1)


def test_canonical_is_independent_of_key_order() -> None:
    assert canonical({"b": 1, "a": [dt.date(2026, 1, 1)]}) == canonical({"a": [dt.date(2026, 1, 1)], "b": 1})
    assert canonical({"a": 1}) != canonical({"a": 2})


def test_orjson_codec_against_stdlib_json_on_a_typical_message(capsys: pytest.CaptureFixture[str]) -> None:
    """Reports the encode+decode speed ratio (no timing is asserted: speed lives in bench/)."""
    message = {
        "role": "assistant",
        "content": "I ran the tests; one failed. " * 8,
        "tool_calls": [{"id": "call-1", "type": "function", "function": {"name": "run", "arguments": "{}"}}],
        "meta": {"tokens": 412, "model": "m", "latency_ms": 812.5},
    }
    codec = Codec()
    assert codec.decode(codec.encode(message)) == message
    assert json.loads(json.dumps(message)) == message
    n = 2000
    ours = min(timeit.repeat(lambda: codec.decode(codec.encode(message)), number=n, repeat=3))
    stdlib = min(timeit.repeat(lambda: json.loads(json.dumps(message).encode()), number=n, repeat=3))
    assert math.isfinite(ours) and math.isfinite(stdlib)
    with capsys.disabled():
        print(
            f"\ncodec round trip of a {len(codec.encode(message))}-byte message: "
            f"statekeel/orjson {ours / n * 1e6:.1f} us, stdlib json {stdlib / n * 1e6:.1f} us "
            f"(stdlib/ours = {stdlib / ours:.1f}x)"
        )


@pytest.mark.parametrize(
    "raw",
    [
        b'{"$sk": "bytes"}',
        b'{"$sk": "bytes", "v": "not base64!"}',
        b'{"$sk": "int", "v": "12x"}',
        b'{"$sk": "datetime", "v": 5}',
        b'{"$sk": "date", "v": "yesterday"}',
        b'{"$sk": "uuid", "v": "nope"}',
        b'{"$sk": "decimal", "v": "1.2.3"}',
        b'{"$sk": "dict", "v": [1]}',
        b'{"$sk": "nulstr", "v": "////"}',
        b'{"$sk": "enum", "v": 1}',
        b'{"$sk": "dataclass", "cls": "test_codec:ToolCall", "v": [1, 2]}',
        b'{"$sk": 7}',
    ],
)
def test_decoding_a_malformed_tagged_value_raises_serialization_error(raw: bytes) -> None:
    with pytest.raises(SerializationError):
        Codec().decode(raw)


class Spy:
    """A class that must never be instantiated by decoding stored data."""

    calls: list[Any] = []

    def __init__(self, *args: Any) -> None:
        Spy.calls.append(args)


@pytest.mark.parametrize("tag", ["enum", "dataclass"])
def test_decoding_never_instantiates_a_class_that_is_not_an_enum_or_dataclass(tag: str) -> None:
    ref = f"{Spy.__module__}:{Spy.__qualname__}"
    raw = json.dumps({"$sk": tag, "cls": ref, "v": "payload" if tag == "enum" else {}}).encode()
    with pytest.raises(SerializationError):
        Codec().decode(raw)
    assert Spy.calls == []
    with pytest.raises(SerializationError):
        Codec().decode(json.dumps({"$sk": "enum", "cls": "subprocess:Popen", "v": ["true"]}).encode())


def test_plain_floats_encode_as_plain_json_numbers() -> None:
    # Only the floats JSONB would change are tagged: everyday values stay readable JSON.
    assert statekeel.codec.encode({"x": 0.5, "y": 1.0, "z": 123.25}) == b'{"x":0.5,"y":1.0,"z":123.25}'


def test_tagged_floats_decode_exactly() -> None:
    raw = statekeel.codec.encode(FLOATS)
    assert same_value(statekeel.codec.decode(raw), FLOATS)


def test_datetime_in_a_named_time_zone_comes_back_in_that_zone() -> None:
    # A fixed offset instead of the zone would move "same time tomorrow" by an hour across a DST change.
    from zoneinfo import ZoneInfo

    paris = ZoneInfo("Europe/Paris")
    before_dst = dt.datetime(2026, 3, 28, 9, 0, tzinfo=paris)
    ambiguous = dt.datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=paris)
    back = statekeel.codec.decode(statekeel.codec.encode([before_dst, ambiguous]))
    assert back[0].tzinfo == paris and back[0] == before_dst
    assert (back[0] + dt.timedelta(days=1)).hour == 9  # wall-clock arithmetic in the zone
    assert (back[0] + dt.timedelta(days=1)).utcoffset() == dt.timedelta(hours=2)
    assert back[1].tzinfo == paris and back[1].fold == 1 and back[1] == ambiguous


def test_a_stored_zone_name_that_is_not_a_zone_is_a_serialization_error() -> None:
    for zone in ("Nowhere/Atlantis", "../../etc/passwd", 7):
        raw = statekeel.codec.encode({"x": 1}).replace(
            b'{"x":1}',
            b'{"x":{"$sk":"datetime","v":"2026-01-01T00:00:00+00:00","tz":' + orjson.dumps(zone) + b"}}",
        )
        with pytest.raises(statekeel.SerializationError):
            statekeel.codec.decode(raw)
