"""Values come back from every backend exactly as they went in, PostgreSQL's JSONB included.

JSONB stores numbers as ``numeric``: ``1e16`` would come back as the integer ``10000000000000000`` and
``-0.0`` as ``0.0`` if the codec did not keep such floats apart from plain JSON numbers.
"""

from __future__ import annotations

import datetime as dt

import statekeel
from helpers import FLOATS, same_value
from statekeel.backends.base import NewMessage


async def test_floats_in_messages_come_back_as_the_same_floats(store: statekeel.Store) -> None:
    payload = {"role": "tool", "content": "x", "numbers": FLOATS, "nested": {"t": 1.7e18}}
    await store.backend.append_messages(
        "s", 0, [NewMessage("tool", store.codec.encode(payload))], create=True
    )
    (row,) = await store.backend.read_messages("s")
    assert same_value(row.payload, payload), row.payload
    loaded = await store.backend.load_session_payloads("s")
    assert loaded is not None
    assert same_value(loaded.messages[0], payload), loaded.messages[0]


async def test_floats_in_task_metadata_and_results_come_back_as_the_same_floats(
    store: statekeel.Store,
) -> None:
    task = await store.tasks.create("t", metadata={"numbers": FLOATS})
    got = await store.tasks.get(task.id)
    assert got is not None
    assert same_value(got.metadata, {"numbers": FLOATS}), got.metadata


async def test_zoned_datetimes_survive_every_backend(store: statekeel.Store) -> None:
    from zoneinfo import ZoneInfo

    at = dt.datetime(2026, 3, 28, 9, 0, tzinfo=ZoneInfo("America/New_York"))
    task = await store.tasks.create("t", metadata={"due": at})
    got = await store.tasks.get(task.id)
    assert got is not None
    assert got.metadata["due"] == at and got.metadata["due"].tzinfo == at.tzinfo
