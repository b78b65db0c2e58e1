"""Traces, the buffered tier, on every backend: what ``record`` accepts and refuses, when spans reach
storage (interval, batch size, ``flush()``, close), the bounded buffer, and reads by trace and by time."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import statekeel
from statekeel import Span, TraceLog

Store = statekeel.Store
pytestmark = pytest.mark.kinds("traces")
T0 = dt.datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def span(span_id: str, start: float = 0.0, **fields: Any) -> dict[str, Any]:
    return {"span_id": span_id, "name": fields.pop("name", "step"), "started_at": at(start), **fields}


async def rows(store: Store) -> int:
    return await store.backend.count_rows("traces")


async def wait_stored(store: Store, trace_id: str, count: int, *, deadline_s: float = 10.0) -> float:
    """Poll storage directly (no flush) until ``trace_id`` has ``count`` spans; seconds it took."""
    started = time.monotonic()
    while len(await store.backend.read_trace(trace_id)) < count:
        if time.monotonic() - started > deadline_s:
            raise AssertionError(f"{count} spans of {trace_id} were not written within {deadline_s} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - started


async def test_recorded_spans_come_back_in_start_order_with_every_field(store: Store) -> None:
    paris = ZoneInfo("Europe/Paris")
    store.traces.record("t1", span("b", 2, name="llm call", kind="llm", parent_span_id="a", status="ok"))
    store.traces.record(
        "t1",
        {
            "span_id": "a",
            "name": "agent turn",
            "kind": "agent",
            "started_at": at(0).astimezone(paris),
            "ended_at": at(5).astimezone(paris),
            "attributes": {"model": "m-1", "tokens": 2**70, "when": at(1), "blob": b"\x00\x01", "n": [1.5]},
        },
    )
    store.traces.record(
        "t1", Span(trace_id="t1", span_id="c", name="read_file", kind="tool", started_at=at(1))
    )
    store.traces.record("other", span("a", 0))
    await store.traces.flush()
    got = await store.traces.get("t1")
    assert [s.span_id for s in got] == ["a", "c", "b"]
    a, c, b = got
    assert a == Span(
        trace_id="t1",
        span_id="a",
        name="agent turn",
        kind="agent",
        status="unset",
        attributes={"model": "m-1", "tokens": 2**70, "when": at(1), "blob": b"\x00\x01", "n": [1.5]},
        started_at=at(0),
        ended_at=at(5),
    )
    assert a.started_at.tzinfo == dt.UTC and a.duration == dt.timedelta(seconds=5)
    assert (b.parent_span_id, b.kind, b.status, b.ended_at, b.duration) == ("a", "llm", "ok", None, None)
    assert (c.kind, c.attributes, c.parent_span_id) == ("tool", {}, None)
    assert await store.traces.get("no-such-trace") == []
    assert await rows(store) == 4


async def test_started_at_defaults_to_the_time_of_the_record_call(store: Store) -> None:
    before = dt.datetime.now(dt.UTC)
    store.traces.record("t", {"span_id": "a", "name": "event"})
    store.traces.record("t", Span(trace_id="t", span_id="b", name="event"))
    after = dt.datetime.now(dt.UTC)
    spans = await store.traces.get("t")
    assert len(spans) == 2 and all(before <= s.started_at <= after for s in spans)


async def test_kind_and_status_are_case_insensitive_and_stored_lower_case(store: Store) -> None:
    store.traces.record("t", span("a", kind="LLM", status="Error"))
    store.traces.record("t", span("b", kind="Client", status="OK"))
    [a, b] = await store.traces.get("t")
    assert (a.kind, a.status, b.kind, b.status) == ("llm", "error", "client", "ok")


async def test_a_span_recorded_again_replaces_the_earlier_record(store: Store) -> None:
    store.traces.record("t", span("s", 0, name="tool", attributes={"phase": "start"}))
    await store.traces.flush()
    assert (await store.traces.get("t"))[0].ended_at is None
    store.traces.record(
        "t", span("s", 0, name="tool", ended_at=at(3), status="ok", attributes={"phase": "end"})
    )
    await store.traces.flush()
    [done] = await store.traces.get("t")
    assert (done.ended_at, done.status, done.attributes) == (at(3), "ok", {"phase": "end"})
    # Within one batch too: the last record wins.
    for n in range(5):
        store.traces.record("t", span("s", 0, name="tool", attributes={"n": n}))
    await store.traces.flush()
    assert [s.attributes for s in await store.traces.get("t")] == [{"n": 4}]
    assert await rows(store) == 1


async def test_reads_include_spans_still_buffered(store: Store) -> None:
    store.traces.record("t", span("a"))
    assert [s.span_id for s in await store.traces.get("t")] == ["a"]
    store.traces.record("t", span("b", 1))
    assert [s.span_id for s in (await store.traces.query()).items] == ["b", "a"]


async def test_spans_reach_storage_without_flush_within_the_interval(store: Store) -> None:
    store.traces.record("t", span("a"))
    # The default interval is 100 ms; the deadline only bounds a stuck writer on a loaded machine.
    await wait_stored(store, "t", 1)
    assert store.traces.pending == 0


async def test_a_full_batch_is_written_at_once_without_waiting_for_the_interval(store: Store) -> None:
    log = TraceLog(store.backend, store.codec, batch_size=20, interval=60)
    try:
        for n in range(20):
            log.record("t", span(f"s{n:02d}", n))
        await wait_stored(store, "t", 20)
        log.record("t", span("late", 99))
        await asyncio.sleep(0.3)  # far below the 60 s interval: a lone span must still be waiting
        assert log.pending == 1 and await rows(store) == 20
    finally:
        await log.close()
    assert await rows(store) == 21  # close writes it


async def test_query_pages_newest_first_through_every_span(store: Store) -> None:
    # Ties on started_at across traces and spans: the cursor must neither skip nor repeat.
    expected = []
    for t in range(4):
        for s in range(6):
            store.traces.record(f"t{t}", span(f"s{s}", s // 2))
            expected.append((at(s // 2), f"t{t}", f"s{s}"))
    expected.sort(reverse=True)
    seen: list[tuple[dt.datetime, str, str]] = []
    cursor = None
    pages = 0
    while True:
        page = await store.traces.query(limit=5, cursor=cursor)
        seen.extend((s.started_at, s.trace_id, s.span_id) for s in page.items)
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == expected and pages == 5


async def test_query_filters_by_time_name_and_status(store: Store) -> None:
    for n in range(10):
        store.traces.record(
            "t",
            span(f"s{n}", n, name="tool" if n % 2 else "llm", status="error" if n % 3 == 0 else "ok"),
        )

    async def ids(**filters: Any) -> list[str]:
        return [s.span_id for s in (await store.traces.query(**filters)).items]

    assert await ids(since=at(3), until=at(7)) == ["s6", "s5", "s4", "s3"]  # [since, until)
    assert await ids(until=at(2)) == ["s1", "s0"]
    assert await ids(since=at(8)) == ["s9", "s8"]
    assert await ids(name="tool") == ["s9", "s7", "s5", "s3", "s1"]
    assert await ids(status="error") == ["s9", "s6", "s3", "s0"]
    assert await ids(name="tool", status="ERROR") == ["s9", "s3"]
    assert await ids(name="llm", status="error", since=at(1), until=at(6)) == []
    assert await ids(since=at(4), until=at(4)) == []
    page = await store.traces.query(name="tool", limit=2)
    assert [s.span_id for s in page.items] == ["s9", "s7"]
    page = await store.traces.query(name="tool", limit=2, cursor=page.next_cursor)
    assert [s.span_id for s in page.items] == ["s5", "s3"]


@pytest.mark.parametrize(
    "filters",
    [
        {"limit": 0},
        {"limit": "10"},
        {"cursor": "not-a-cursor"},
        {"cursor": 5},
        {"status": "failed"},
        {"name": ""},
        {"since": dt.datetime(2026, 1, 1)},
        {"since": at(5), "until": at(1)},
    ],
    ids=["limit-0", "limit-str", "cursor-garbage", "cursor-int", "status", "name", "naive-since", "inverted"],
)
async def test_bad_query_arguments_are_invalid_argument(store: Store, filters: dict[str, Any]) -> None:
    with pytest.raises(statekeel.InvalidArgument):
        await store.traces.query(**filters)


BAD_SPANS: list[tuple[str, Any, Any]] = [
    ("empty-trace-id", "", span("a")),
    ("int-trace-id", 7, span("a")),
    ("none-trace-id", None, span("a")),
    ("empty-span-id", "t", span("")),
    ("int-span-id", "t", {**span("a"), "span_id": 3}),
    ("nul-span-id", "t", span("a\x00b")),
    ("empty-parent", "t", span("a", parent_span_id="")),
    ("own-parent", "t", span("a", parent_span_id="a")),
    ("ends-before-start", "t", span("a", 5, ended_at=at(4))),
    ("naive-start", "t", {**span("a"), "started_at": dt.datetime(2026, 1, 1)}),
    ("naive-end", "t", span("a", ended_at=dt.datetime(2026, 1, 1))),
    ("date-not-datetime", "t", {**span("a"), "started_at": dt.date(2026, 1, 1)}),
    ("string-start", "t", {**span("a"), "started_at": "2026-01-01T00:00:00Z"}),
    ("unknown-field", "t", span("a", duration_ms=5)),
    ("missing-name", "t", {"span_id": "a", "started_at": at(0)}),
    ("missing-span-id", "t", {"name": "x", "started_at": at(0)}),
    ("int-start", "t", {**span("a"), "started_at": 0}),
    ("empty-name", "t", span("a", name="")),
    ("unknown-kind", "t", span("a", kind="banana")),
    ("unknown-status", "t", span("a", status="done")),
    ("kind-not-text", "t", span("a", kind=["llm"])),
    ("attributes-set", "t", span("a", attributes={"s": {1, 2}})),
    ("attributes-nan", "t", span("a", attributes={"x": float("nan")})),
    ("attributes-int-key", "t", span("a", attributes={1: "x"})),
    ("attributes-object", "t", span("a", attributes={"o": object()})),
    ("attributes-not-mapping", "t", span("a", attributes=["x"])),
    ("attributes-too-large", "t", span("a", attributes={"x": "y" * (17 * 1024 * 1024)})),
    ("other-trace-id", "t", span("a", trace_id="u")),
    ("span-of-other-trace", "t", Span(trace_id="u", span_id="a", name="x", started_at=at(0))),
    ("not-a-span", "t", ["a", "x"]),
]


@pytest.mark.parametrize(("trace_id", "bad"), [b[1:] for b in BAD_SPANS], ids=[b[0] for b in BAD_SPANS])
async def test_bad_span_is_refused_at_record_and_nothing_is_written(
    store: Store, trace_id: Any, bad: Any
) -> None:
    store.traces.record("t", span("good", 0, attributes={"k": 1}))
    with pytest.raises(statekeel.InvalidArgument):
        store.traces.record(trace_id, bad)
    assert store.traces.pending <= 1
    await store.traces.flush()
    assert await rows(store) == 1
    assert [s.span_id for s in await store.traces.get("t")] == ["good"]
    assert store.traces.dropped == 0 and store.traces.pending == 0
    store.traces.record("t", span("after", 1))  # the store stays usable
    assert [s.span_id for s in await store.traces.get("t")] == ["good", "after"]


@pytest.mark.kinds("traces", "store")  # recover()
async def test_a_full_buffer_drops_the_oldest_spans_and_counts_them(store: Store) -> None:
    # At least 10,000 spans are held; the oldest go first. Nothing yields to the event loop in between,
    # so the background writer cannot take any of them yet.
    for n in range(10_003):
        store.traces.record("t", span(f"{n:05d}", n))
    assert store.traces.dropped == 3 and store.traces.pending == 10_000
    assert (await store.recover()).traces_dropped == 3
    await store.traces.flush()
    assert await rows(store) == 10_000
    assert await store.backend.spans_dropped() == 3  # stored with the flush
    kept = await store.traces.get("t")
    assert kept[0].span_id == "00003" and kept[-1].span_id == "10002"
    report = await store.recover()
    assert report.traces_dropped == 3 and report.summary()["traces_dropped"] == 3 and report.ok


@pytest.mark.kinds("traces", "store")  # recover()
async def test_dropped_count_survives_a_reopen(store_url: str, tmp_path: Any) -> None:
    if store_url.startswith("memory:"):
        pytest.skip("an in-memory store does not outlive its process")
    async with statekeel.open_store(store_url) as store:
        log = TraceLog(store.backend, store.codec, capacity=4)
        for n in range(10):
            log.record("t", span(f"s{n}", n))
        await log.close()
        assert log.dropped == 6
    async with statekeel.open_store(store_url) as store:
        assert (await store.recover()).traces_dropped == 6
        assert [s.span_id for s in await store.traces.get("t")] == ["s6", "s7", "s8", "s9"]


async def test_close_writes_the_buffered_spans(store_url: str) -> None:
    if store_url.startswith("memory:"):
        pytest.skip("an in-memory store does not outlive its process")
    trace_id = uuid.uuid4().hex
    store = await statekeel.open_store(store_url)
    for n in range(50):
        store.traces.record(trace_id, span(f"s{n:02d}", n))
    await store.close()
    async with statekeel.open_store(store_url) as store:
        assert [s.span_id for s in await store.traces.get(trace_id)] == [f"s{n:02d}" for n in range(50)]


async def test_record_after_close_is_dropped_and_counted_not_raised(store_url: str) -> None:
    store = await statekeel.open_store(store_url)
    await store.close()
    store.traces.record("t", span("late"))
    assert store.traces.dropped == 1


async def test_spans_recorded_from_another_thread_are_written(store: Store) -> None:
    def worker() -> None:
        for n in range(200):
            store.traces.record("threads", span(f"s{n:03d}", n))

    await asyncio.gather(*(asyncio.to_thread(worker) for _ in range(2)))
    await store.traces.flush()
    assert len(await store.traces.get("threads")) == 200


async def test_spans_recorded_only_from_other_threads_reach_storage_without_flush(store: Store) -> None:
    await asyncio.to_thread(lambda: [store.traces.record("threads", span(f"s{n}", n)) for n in range(3)])
    await wait_stored(store, "threads", 3)


@pytest.mark.kinds("traces", "transactions")
async def test_flush_inside_atomic_is_refused(store: Store) -> None:
    store.traces.record("t", span("a"))
    async with store.backend.atomic():
        with pytest.raises(statekeel.InvalidArgument, match="atomic"):
            await store.traces.flush()
    await store.traces.flush()
    assert await rows(store) == 1


class _Rollback(Exception):
    pass


@pytest.mark.kinds("traces", "transactions")
async def test_background_writer_never_joins_the_atomic_block_of_the_first_caller(store: Store) -> None:
    # The writer task is started by the first record(), made here inside a block that then rolls back.
    log = TraceLog(store.backend, store.codec, batch_size=1)
    try:
        with pytest.raises(_Rollback):
            async with store.backend.atomic():
                log.record("t", span("inside"))
                await store.backend.read_trace("t")  # yields: the writer starts inside the block's scope
                raise _Rollback
        async with asyncio.timeout(30):
            await log.flush()
        assert [s.span_id for s in await store.backend.read_trace("t")] == ["inside"]
    finally:
        await log.close()


async def test_of_session_finds_the_trace_named_after_it_and_traces_whose_spans_name_it(store: Store) -> None:
    store.traces.record("chat-1", span("turn", 0))
    store.traces.record("t-later", span("a", 10, attributes={"session_key": "chat-1"}))
    store.traces.record("t-otel", span("b", 5, attributes={"session.id": "chat-1"}))
    store.traces.record("t-other", span("c", 20, attributes={"session_key": "chat-2"}))
    store.traces.record("t-number", span("d", 30, attributes={"session_key": 1}))
    store.traces.record("t-case", span("e", 40, attributes={"session_key": "CHAT-1"}))
    assert await store.traces.of_session("chat-1") == ["t-later", "t-otel", "chat-1"]  # newest first
    assert await store.traces.of_session("chat-1", limit=1) == ["t-later"]
    assert await store.traces.of_session("nobody") == []
    with pytest.raises(statekeel.InvalidArgument):
        await store.traces.of_session("chat-1", limit=0)
