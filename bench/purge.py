"""Purge costs: ``python bench/purge.py [--spans 1000000] [--batch 1000] [--pg URL]``.

A store holding ``--spans`` trace spans (~150 bytes of attributes each), all past the 30-day TTL, is
purged with ``store.purge()``. Reported: the purge's seconds, its batches and the longest one (the time a
batch held its transaction: on SQLite the write lock), and — what other writers feel — the latency of a
critical write (``memory.put``) made every 5 ms by another process during the purge (max and p99). On
SQLite also the file before and after (a new file gives its pages back: incremental auto-vacuum) and, for
a file made before incremental auto-vacuum, the free pages the purge leaves and the time of
``store.vacuum()``. Writes ``bench/results/purge-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import statekeel  # noqa: E402
from common import pg_databases, write_results  # noqa: E402
from statekeel.backends.base import NewSpan  # noqa: E402

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
ATTRIBUTES = {"path": "src/module.py", "bytes": 4096, "model": "gpt-4o-mini", "note": "read a file"}

PROBE = """
import asyncio, json, sys, time
import statekeel

async def main(url):
    async with statekeel.open_store(url) as store:
        await store.memory.put("user", "probe", 0)
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        stop = loop.run_in_executor(None, sys.stdin.readline)
        took, n = [], 0
        while not stop.done():
            n += 1
            began = time.perf_counter()
            await store.memory.put("user", "probe", n)
            took.append(time.perf_counter() - began)
            await asyncio.sleep(0.005)
        print(json.dumps(took), flush=True)

asyncio.run(main(sys.argv[1]))
"""


async def fill(url: str, spans: int) -> float:
    began = time.perf_counter()
    async with statekeel.open_store(url) as store:
        attributes = store.codec.encode(ATTRIBUTES)
        for start in range(0, spans, 10_000):
            batch = [
                NewSpan(f"trace-{n // 20:06d}", f"{n:08x}", None, "tool.read_file", "tool", "ok", attributes,
                        T0 + dt.timedelta(microseconds=n), T0 + dt.timedelta(microseconds=n + 5))
                for n in range(start, min(spans, start + 10_000))
            ]  # fmt: skip
            await store.backend.write_spans(batch)
        assert await store.backend.count_rows("traces") == spans
        await store.backend.shrink_log()
    return time.perf_counter() - began


def _size(path: str | None) -> dict[str, int] | None:
    if path is None:
        return None
    return {f: os.path.getsize(path + f) if os.path.exists(path + f) else 0 for f in ("", "-wal")}


async def purge_with_probe(url: str, batch: int) -> dict[str, Any]:
    probe = subprocess.Popen(
        [sys.executable, "-c", PROBE, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert probe.stdout is not None and probe.stdin is not None
    assert probe.stdout.readline().strip() == "ready"
    try:
        async with statekeel.open_store(url, retention=statekeel.Retention(batch_size=batch)) as store:
            dry_began = time.perf_counter()
            dry = await store.purge(T0 + dt.timedelta(days=31), dry_run=True)
            dry_s = time.perf_counter() - dry_began
            report = await store.purge(T0 + dt.timedelta(days=31))
            assert report.traces == dry.traces and await store.backend.count_rows("traces") == 0
    finally:
        probe.stdin.write("stop\n")
        probe.stdin.flush()
        took = sorted(json.loads(probe.stdout.readline()))
        probe.wait(timeout=60)
    return {
        "purged": report.traces,
        "seconds": report.seconds,
        "batches": report.batches,
        "longest_batch_ms": report.longest_batch_seconds * 1000,
        "dry_run_s": dry_s,
        "reclaimed_pages": report.reclaimed_pages,
        "free_pages_left": report.free_pages,
        "probe_writes": len(took),
        "probe_max_ms": took[-1] * 1000,
        "probe_p99_ms": took[int(len(took) * 0.99)] * 1000,
        "probe_median_ms": took[len(took) // 2] * 1000,
    }


async def sqlite_run(directory: str, spans: int, batch: int, *, old_file: bool) -> dict[str, Any]:
    path = os.path.join(directory, "old.db" if old_file else "new.db")
    if old_file:  # a file made before incremental auto-vacuum (its first table existed already)
        conn = sqlite3.connect(path)
        conn.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "checksum TEXT NOT NULL, applied_at INTEGER NOT NULL)"
        )
        conn.close()
    url = f"sqlite:///{path}"
    out: dict[str, Any] = {"fill_s": await fill(url, spans), "before": _size(path)}
    out.update(await purge_with_probe(url, batch))
    out["after"] = _size(path)
    if old_file:
        async with statekeel.open_store(url) as store:
            began = time.perf_counter()
            await store.vacuum()
            out["vacuum_s"] = time.perf_counter() - began
        out["after_vacuum"] = _size(path)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000, help="Retention.batch_size")
    parser.add_argument("--pg", default=None, help="admin URL of a PostgreSQL server, e.g. …/postgres")
    parser.add_argument("--no-old-file", action="store_true", help="skip the pre-auto-vacuum file")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "args": vars(args),
    }
    with tempfile.TemporaryDirectory() as directory:
        results["sqlite"] = asyncio.run(sqlite_run(directory, args.spans, args.batch, old_file=False))
        print("sqlite", results["sqlite"], flush=True)
        if not args.no_old_file:
            results["sqlite_old_file"] = asyncio.run(
                sqlite_run(directory, args.spans, args.batch, old_file=True)
            )
            print("sqlite, older file", results["sqlite_old_file"], flush=True)
    if args.pg:
        with pg_databases(args.pg, 1) as (url,):
            fill_s = asyncio.run(fill(url, args.spans))
            results["postgres"] = {"fill_s": fill_s, **asyncio.run(purge_with_probe(url, args.batch))}
            print("postgres", results["postgres"], flush=True)
    write_results("purge", results)


if __name__ == "__main__":
    main()
