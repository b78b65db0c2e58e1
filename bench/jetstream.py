"""NATS JetStream beside SQLite and PostgreSQL: ``python bench/jetstream.py [--entries 2000] [--spans 20000]
[--nats nats://127.0.0.1:4222] [--pg postgresql://…/postgres] [--cluster]``.

The kinds a plain NATS store holds, measured on every backend the same way:

- session saves: 500 saves of one message each (``sessions.save``), median and p99 in µs; then the
  1,000-message session loaded (``backend.load_session_payloads``) by a store that never read it, and
  again (NATS: from the folded state it keeps, after one request for the subject's last sequence);
- audit append: ``store.audit.append`` one at a time (each returns once committed / acknowledged), median
  and p99 in µs, then appends/s from 8 concurrent callers;
- audit load: ``audit.query`` pages of 1,000 through the whole log and ``audit.verify()``, entries/s;
- spans: ``traces.record`` of ``--spans`` spans then ``flush()``, spans/s to storage; then
  ``traces.get`` of a 1,000-span trace, ms.

Every run checks what it reads back (counts, a verifying chain). NATS streams are made under a prefix of
their own and deleted afterwards; with ``--cluster`` the NATS figures are also taken on a 3-node cluster
(R3 streams) started on loopback ports from the ``nats-server`` binary. Prints the figures and writes
``bench/results/jetstream-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reliability"))

import statekeel  # noqa: E402
from common import pg_databases, write_results  # noqa: E402

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


async def drop_streams(servers: str, prefix: str) -> None:
    import nats

    hosts = servers.removeprefix("nats://").split(",")
    nc = await nats.connect([f"nats://{h}" for h in hosts])
    try:
        js = nc.jetstream()
        for info in await js.streams_info():
            if info.config.name and info.config.name.startswith(f"{prefix}_"):
                await js.delete_stream(info.config.name)
    finally:
        await nc.close()


def span(n: int) -> dict[str, Any]:
    return {
        "span_id": f"{n:08x}",
        "name": "tool.read_file",
        "kind": "tool",
        "status": "ok",
        "started_at": T0 + dt.timedelta(microseconds=n * 10),
        "ended_at": T0 + dt.timedelta(microseconds=n * 10 + 7),
        "attributes": {"path": f"src/module_{n % 50}.py", "bytes": 4096 + n % 1000, "cached": n % 2 == 0},
    }


async def measure_sessions(url: str, saves: int) -> dict[str, Any]:
    """Saves of one message each (the agent loop's write), then loads of the 1,000-message session."""
    async with statekeel.open_store(url) as store:
        session = await store.sessions.get_or_create("bench")
        times: list[float] = []
        for i in range(saves):
            session.add_message("user" if i % 2 == 0 else "assistant", f"message {i} " + "x" * 200)
            began = time.perf_counter()
            await store.sessions.save(session)
            times.append(time.perf_counter() - began)
        times.sort()
        for i in range(saves, 1000):
            session.add_message("user", f"message {i} " + "x" * 200)
        await store.sessions.save(session)
    async with statekeel.open_store(url) as store:  # a process that never saw the session
        began = time.perf_counter()
        loaded = await store.backend.load_session_payloads("bench")
        cold_ms = (time.perf_counter() - began) * 1000
        assert loaded is not None and len(loaded.messages) == 1000, loaded
        warm: list[float] = []
        for _ in range(20):
            began = time.perf_counter()
            again = await store.backend.load_session_payloads("bench")
            warm.append(time.perf_counter() - began)
            assert again is not None and len(again.messages) == 1000
    return {
        "save_median_us": statistics.median(times) * 1e6,
        "save_p99_us": times[int(len(times) * 0.99)] * 1e6,
        "load_cold_ms": cold_ms,
        "load_warm_ms": statistics.median(warm) * 1000,
    }


async def measure(url: str, entries: int, spans: int) -> dict[str, Any]:
    figures = await measure_sessions(url, 500)
    async with statekeel.open_store(url) as store:
        times: list[float] = []
        for i in range(entries):
            began = time.perf_counter()
            await store.audit.append("tool.call", "agent", f"task:{i % 20}", {"i": i, "tool": "read_file"})
            times.append(time.perf_counter() - began)
        times.sort()
        began = time.perf_counter()
        await asyncio.gather(
            *(
                store.audit.append("tool.call", f"agent-{w}", "task:c", {"i": i})
                for w in range(8)
                for i in range(entries // 8)
            )
        )
        concurrent = (entries // 8 * 8) / (time.perf_counter() - began)
        total = entries + entries // 8 * 8
        began = time.perf_counter()
        read = 0
        while True:
            page = await store.audit.query(limit=1000, after_seq=read)
            read += len(page)
            if len(page) < 1000:
                break
        query_s = time.perf_counter() - began
        assert read == total, (read, total)
        began = time.perf_counter()
        report = await store.audit.verify()
        verify_s = time.perf_counter() - began
        assert report.ok and report.count == total, report

        began = time.perf_counter()
        for n in range(spans):
            store.traces.record(f"trace-{n // 1000}", span(n))
            if n % 100 == 99:
                await asyncio.sleep(0)
                while store.traces.pending > 5000:  # the writer is behind: wait, drop nothing
                    await asyncio.sleep(0.001)
        await store.traces.flush()
        spans_s = spans / (time.perf_counter() - began)
        began = time.perf_counter()
        got = await store.traces.get("trace-0")
        get_ms = (time.perf_counter() - began) * 1000
        assert len(got) == min(1000, spans), len(got)
        assert store.traces.dropped == 0
    return {
        **figures,
        "append_median_us": statistics.median(times) * 1e6,
        "append_p99_us": times[int(len(times) * 0.99)] * 1e6,
        "append_concurrent_per_s": concurrent,
        "query_entries_per_s": total / query_s,
        "verify_entries_per_s": total / verify_s,
        "spans_per_s": spans_s,
        "get_1000_span_trace_ms": get_ms,
    }


async def measure_nats(servers: str, entries: int, spans: int, **options: Any) -> dict[str, Any]:
    prefix = f"skbench{uuid.uuid4().hex[:8]}"
    query = "&".join(f"{k}={v}" for k, v in {"prefix": prefix, **options}.items())
    try:
        return await measure(f"{servers}?{query}", entries, spans)
    finally:
        await drop_streams(servers, prefix)


def run_cluster(entries: int, spans: int) -> dict[str, Any]:
    from test_nats_jetstream_cluster import Cluster, wait_ready

    with tempfile.TemporaryDirectory() as directory:
        from pathlib import Path

        cluster = Cluster(Path(directory))
        try:
            for node in cluster.nodes:
                cluster.start(node)
            asyncio.run(wait_ready(cluster))
            servers = ",".join(f"127.0.0.1:{n.client_port}" for n in cluster.nodes)
            return asyncio.run(measure_nats(f"nats://{servers}", entries, spans, replicas=3))
        finally:
            cluster.stop_all()


ROWS = [
    ("session save of one message: median µs", "save_median_us", "{:,.0f}"),
    ("session save of one message: p99 µs", "save_p99_us", "{:,.0f}"),
    ("load of a 1,000-message session, a process that never read it: ms", "load_cold_ms", "{:,.1f}"),
    ("load of a 1,000-message session, again: ms", "load_warm_ms", "{:,.1f}"),
    ("audit append, one at a time: median µs", "append_median_us", "{:,.0f}"),
    ("audit append, one at a time: p99 µs", "append_p99_us", "{:,.0f}"),
    ("audit append, 8 concurrent callers: appends/s", "append_concurrent_per_s", "{:,.0f}"),
    ("audit.query pages of 1,000: entries/s", "query_entries_per_s", "{:,.0f}"),
    ("audit.verify(): entries/s", "verify_entries_per_s", "{:,.0f}"),
    ("traces.record + flush: spans/s", "spans_per_s", "{:,.0f}"),
    ("traces.get of 1,000 spans: ms", "get_1000_span_trace_ms", "{:,.1f}"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--nats", default="nats://127.0.0.1:4222")
    parser.add_argument("--pg", default=None, help="admin URL of a PostgreSQL server, e.g. …/postgres")
    parser.add_argument("--cluster", action="store_true", help="also on a 3-node cluster (R3)")
    args = parser.parse_args()
    results: dict[str, Any] = {"when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{os.path.join(directory, 'bench.db')}"
        results["sqlite"] = asyncio.run(measure(url, args.entries, args.spans))
    if args.pg:
        with pg_databases(args.pg, 1) as (pg_url,):
            results["postgres"] = asyncio.run(measure(pg_url, args.entries, args.spans))
    results["nats"] = asyncio.run(measure_nats(args.nats, args.entries, args.spans))
    if args.cluster:
        results["nats-cluster-r3"] = run_cluster(args.entries, args.spans)
    names = [k for k in results if k != "when"]
    print("| figure | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for label, key, fmt in ROWS:
        print(f"| {label} | " + " | ".join(fmt.format(results[n][key]) for n in names) + " |")
    write_results("jetstream", results)


if __name__ == "__main__":
    main()
