"""Trace costs: ``python bench/traces.py [--spans 50000] [--sustained 200000] [--pg URL]``.

- ``record`` overhead on the caller: every ``store.traces.record(trace_id, span)`` call is timed (a mapping
  of eight fields with ~200 bytes of attributes, and the same as a ``Span``). The loop yields every 100
  spans, as an agent's would, so the background writer runs in between, and waits (untimed) while 5,000
  spans are behind, so that nothing is dropped. Median and p99 in µs.
- Sustained spans/s to disk: spans are recorded as fast as the writer takes them (same yields) until
  ``flush()`` returns; and the time to write one full batch of 1,000 spans (``backend.write_spans``),
  which on SQLite at durability normal runs on the event loop's thread: the longest the writer holds it.

Every run checks what it wrote (count, no drops). SQLite file at durability normal and full; PostgreSQL
too with ``--pg postgresql://…/postgres`` (a database is created and dropped). Prints the figures and
writes ``bench/results/traces-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import tempfile
import time
import uuid
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

import statekeel  # noqa: E402
from statekeel.backends.base import NewSpan  # noqa: E402
from tasks_costs import _pg_admin  # noqa: E402

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def make_span(n: int) -> dict[str, Any]:
    """A tool span as an agent would record it: ~200 bytes of attributes."""
    return {
        "span_id": f"{n:08x}",
        "parent_span_id": "root",
        "name": "tool.read_file" if n % 3 else "llm.chat",
        "kind": "tool" if n % 3 else "llm",
        "status": "ok",
        "started_at": T0 + dt.timedelta(microseconds=n * 10),
        "ended_at": T0 + dt.timedelta(microseconds=n * 10 + 7),
        "attributes": {
            "path": f"src/module_{n % 50}.py",
            "bytes": 4096 + n % 1000,
            "model": "gpt-4o-mini",
            "tokens": {"prompt": 812, "completion": 64},
            "cached": n % 2 == 0,
            "note": "read the file to answer the user's question about it",
        },
    }


def _new_span(codec: Any, trace_id: str, span: dict[str, Any]) -> NewSpan:
    """The span as the buffer hands it to the backend."""
    fields = {**span, "attributes": codec.encode(span["attributes"])}
    return NewSpan(trace_id=trace_id, **fields)


async def _yield(traces: Any) -> None:
    """Let the writer run, as an agent's loop would; wait for it while 5,000 spans are behind, so that
    the bench measures what the writer takes, not what a full buffer drops."""
    await asyncio.sleep(0)
    while traces.pending >= 5000:
        await asyncio.sleep(0.001)


def _quantiles(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    return {
        "median_us": statistics.median(ordered) / 1000,
        "p99_us": ordered[int(len(ordered) * 0.99)] / 1000,
    }


async def record_overhead(url: str, n: int, durability: str = "normal") -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with statekeel.open_store(url, durability=durability) as store:
        for form in ("mapping", "Span"):
            trace_id = f"overhead-{form}"
            inputs: list[Any] = [make_span(i) for i in range(n)]
            if form == "Span":
                inputs = [statekeel.Span(trace_id=trace_id, **s) for s in inputs]
            timings: list[int] = []
            record = store.traces.record
            clock = time.perf_counter_ns
            for i, span in enumerate(inputs):
                started = clock()
                record(trace_id, span)
                timings.append(clock() - started)
                if i % 100 == 99:
                    await _yield(store.traces)
            await store.traces.flush()
            stored = len(await store.backend.read_trace(trace_id))
            if stored != n or store.traces.dropped:
                raise SystemExit(f"{url}: {stored} of {n} spans stored, {store.traces.dropped} dropped")
            results[f"record_{form}"] = _quantiles(timings)
    return results


async def sustained(url: str, n: int, durability: str = "normal") -> dict[str, Any]:
    async with statekeel.open_store(url, durability=durability) as store:
        traces = store.traces
        started = time.perf_counter()
        for i in range(n):
            traces.record("sustained", make_span(i))
            if i % 100 == 99:
                await _yield(traces)
        await traces.flush()
        seconds = time.perf_counter() - started
        stored = await store.backend.count_rows("traces")
        if stored != n or traces.dropped:
            raise SystemExit(f"{url}: {stored} of {n} spans stored, {traces.dropped} dropped")
        # One full batch written directly: on SQLite at durability normal it runs inline, on the event
        # loop's thread, so this is also the longest the writer holds the loop.
        batch_ms = []
        for b in range(10):
            batch = [_new_span(store.codec, f"batch-{b}", make_span(i)) for i in range(1000)]
            began = time.perf_counter()
            await store.backend.write_spans(batch)
            batch_ms.append((time.perf_counter() - began) * 1000)
    return {"spans_per_s": n / seconds, "seconds": seconds, "batch_of_1000_ms": statistics.median(batch_ms)}


def _print(name: str, figures: dict[str, Any]) -> None:
    flat = {
        f"{k}.{kk}" if isinstance(v, dict) else k: round(vv if isinstance(v, dict) else v, 2)
        for k, v in figures.items()
        for kk, vv in (v.items() if isinstance(v, dict) else [(k, v)])
    }
    print(name, flat)


async def run_store(url: str, spans: int, spans_sustained: int, durability: str = "normal") -> dict[str, Any]:
    figures = await record_overhead(url, spans, durability)
    # A store of its own: the throughput run counts every row of its table.
    sustained_url = url.replace("overhead", "sustained")
    figures["sustained"] = await sustained(sustained_url, spans_sustained, durability)
    return figures


async def run_postgres(admin: str, spans: int, spans_sustained: int) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:8]
    names = {kind: f"sk_bench_{kind}_{suffix}" for kind in ("overhead", "sustained")}
    base = admin.rsplit("/", 1)[0]
    for name in names.values():
        await _pg_admin(admin, f'CREATE DATABASE "{name}"')
    try:
        return await run_store(f"{base}/{names['overhead']}", spans, spans_sustained)
    finally:
        for name in names.values():
            await _pg_admin(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--spans", type=int, default=50_000, help="spans timed one by one, per form")
    parser.add_argument("--sustained", type=int, default=200_000, help="spans of the throughput run")
    parser.add_argument("--pg", default=None, help="admin URL of a PostgreSQL server, e.g. …/postgres")
    args = parser.parse_args()
    results: dict[str, Any] = {"when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    with tempfile.TemporaryDirectory() as directory:
        for durability in ("normal", "full"):
            url = f"sqlite:///{os.path.join(directory, f'overhead-{durability}.db')}"
            results[f"sqlite-{durability}"] = asyncio.run(
                run_store(url, args.spans, args.sustained, durability)
            )
            _print(f"sqlite-{durability}", results[f"sqlite-{durability}"])
    if args.pg:
        results["postgres"] = asyncio.run(run_postgres(args.pg, args.spans, args.sustained))
        _print("postgres", results["postgres"])
    path = os.path.join(HERE, "results", f"traces-{dt.datetime.now():%Y%m%d-%H%M%S}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as out:
        json.dump(results, out, indent=2)
    print("results in", os.path.relpath(path, os.path.dirname(HERE)))


if __name__ == "__main__":
    main()
