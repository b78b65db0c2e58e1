"""Values come back from every backend exactly as they went in, PostgreSQL's JSONB included.

JSONB stores numbers as ``numeric``: ``1e16`` comes back as the integer ``10000000000000000`` and ``-0.0``
as ``0.0`` unless the codec keeps them apart from plain JSON numbers.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import orjson
import pytest

import statekeel
from statekeel.backends.base import NewMessage

# Floats a JSON number on PostgreSQL would turn into an int or lose the sign of, and ordinary ones.
FLOATS = [1e16, -1e16, 1.2345e20, 1e300, -1.7976931348623157e308, -0.0, 0.0, 1.0, 0.1, 1.5e-7, 5e-324]


def _same(a: Any, b: Any) -> bool:
    """Equal, of the same type, and with the same sign for zeros (``-0.0 == 0.0`` in Python)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


async def test_floats_in_messages_come_back_as_the_same_floats(store: statekeel.Store) -> None:
    payload = {"role": "tool", "content": "x", "numbers": FLOATS, "nested": {"t": 1.7e18}}
    await store.backend.append_messages(
        "s", 0, [NewMessage("tool", store.codec.encode(payload))], create=True
    )
    (row,) = await store.backend.read_messages("s")
    assert _same(row.payload, payload), row.payload
    loaded = await store.backend.load_session_payloads("s")
    assert loaded is not None
    assert _same(loaded.messages[0], payload), loaded.messages[0]


async def test_floats_in_task_metadata_and_results_come_back_as_the_same_floats(
    store: statekeel.Store,
) -> None:
    task = await store.tasks.create("t", metadata={"numbers": FLOATS})
    got = await store.tasks.get(task.id)
    assert got is not None
    assert _same(got.metadata, {"numbers": FLOATS}), got.metadata


def test_plain_floats_still_encode_as_plain_json_numbers() -> None:
    # Only the floats JSONB would change are tagged: everyday values stay readable JSON.
    assert statekeel.codec.encode({"x": 0.5, "y": 1.0, "z": 123.25}) == b'{"x":0.5,"y":1.0,"z":123.25}'


def test_tagged_floats_decode_exactly() -> None:
    raw = statekeel.codec.encode(FLOATS)
    assert _same(statekeel.codec.decode(raw), FLOATS)


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


async def test_zoned_datetimes_survive_every_backend(store: statekeel.Store) -> None:
    from zoneinfo import ZoneInfo

    at = dt.datetime(2026, 3, 28, 9, 0, tzinfo=ZoneInfo("America/New_York"))
    task = await store.tasks.create("t", metadata={"due": at})
    got = await store.tasks.get(task.id)
    assert got is not None
    assert got.metadata["due"] == at and got.metadata["due"].tzinfo == at.tzinfo


def test_a_stored_zone_name_that_is_not_a_zone_is_a_serialization_error() -> None:
    for zone in ("Nowhere/Atlantis", "../../etc/passwd", 7):
        raw = statekeel.codec.encode({"x": 1}).replace(
            b'{"x":1}',
            b'{"x":{"$sk":"datetime","v":"2026-01-01T00:00:00+00:00","tz":' + orjson.dumps(zone) + b"}}",
        )
        with pytest.raises(statekeel.SerializationError):
            statekeel.codec.decode(raw)
