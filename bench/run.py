"""Run the statekeel benchmarks: ``python bench/run.py [--quick]``.

Measures W1 (one session x 500 turns), W2 (load its 2,000 messages), W3 (50 concurrent sessions x 20
turns) for statekeel, the plain-sqlite3 baseline at NORMAL and FULL, and the peers; then statekeel with
100k sessions / 1M messages stored, and RSS while 100k sessions are touched. Every figure is a median of
``--repeats`` runs in one process, the order of the stores rotated between repeats. Prints a table, writes
``bench/results/<timestamp>.json`` and, with ``--chart``, the append-cost chart.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import floor  # noqa: E402
import large  # noqa: E402
import stores  # noqa: E402
import workloads  # noqa: E402
from messages import turn_sizes  # noqa: E402

med = statistics.median


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git_rev() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=HERE,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    rev = out.stdout.strip() or None
    return f"{rev}+dirty" if rev and dirty.stdout.strip() else rev


async def run_workloads(
    adapters: list[stores.Adapter], repeats: int, turns: int, w3_sessions: int, w3_turns: int, work: str
) -> dict[str, Any]:
    raw: dict[str, dict[str, list[Any]]] = {
        a.name: {"w1_total_s": [], "w1_per_turn_s": [], "growth": [], "w2_s": [], "w3_s": [], "db_bytes": []}
        for a in adapters
    }
    for rep in range(repeats):
        order = adapters[rep % len(adapters) :] + adapters[: rep % len(adapters)]
        for adapter in order:
            d1 = tempfile.mkdtemp(prefix=f"{adapter.name}-", dir=work)
            d2 = tempfile.mkdtemp(prefix=f"{adapter.name}-w3-", dir=work)
            try:
                r1 = await workloads.w1(adapter, d1, turns)
                r2 = await workloads.w2(adapter, d1, turns)
                r3 = await workloads.w3(adapter, d2, w3_sessions, w3_turns)
            finally:
                shutil.rmtree(d1, ignore_errors=True)
                shutil.rmtree(d2, ignore_errors=True)
            out = raw[adapter.name]
            out["w1_total_s"].append(r1.total_s)
            out["w1_per_turn_s"].append(r1.per_turn_s)
            out["growth"].append(r1.growth)
            out["w2_s"].append(r2)
            out["w3_s"].append(r3)
            out["db_bytes"].append(r1.db_bytes)
            print(
                f"  repeat {rep + 1}/{repeats} {adapter.name:16s} W1 {r1.total_s * 1e3:9.1f} ms  "
                f"W2 {r2 * 1e3:8.2f} ms  W3 {r3 * 1e3:9.1f} ms",
                flush=True,
            )
    return raw


def summarize(raw: dict[str, dict[str, list[Any]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, r in raw.items():
        per_turn = r["w1_per_turn_s"]
        first = [med(p[: min(50, len(p) // 2)]) for p in per_turn]
        last = [med(p[-min(50, len(p) // 2) :]) for p in per_turn]
        out[name] = {
            "w1_total_s": med(r["w1_total_s"]),
            "w1_turn_median_s": med(med(p) for p in per_turn),
            "w1_first50_s": med(first),
            "w1_last50_s": med(last),
            "growth": med(r["growth"]),
            "w2_s": med(r["w2_s"]),
            "w3_s": med(r["w3_s"]),
            "db_bytes": med(r["db_bytes"]),
        }
    return out


def per_turn_curve(raw: dict[str, dict[str, list[Any]]]) -> dict[str, list[float]]:
    """For the chart: per turn index, the median over repeats of that turn's append cost."""
    curves = {}
    for name, r in raw.items():
        runs = r["w1_per_turn_s"]
        curves[name] = [med(run[i] for run in runs) for i in range(len(runs[0]))]
    return curves


def run_rss(count: int, work: str) -> dict[str, Any]:
    d = tempfile.mkdtemp(prefix="rss-", dir=work)
    try:
        proc = subprocess.run(
            [sys.executable, os.path.join(HERE, "rss.py"), str(count), d],
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        shutil.rmtree(d, ignore_errors=True)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-2000:] or f"exit code {proc.returncode}"}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def targets(
    s: dict[str, dict[str, float]], big: dict[str, Any] | None, rss: dict[str, Any] | None
) -> list[Any]:
    """Each issue-6 target: (name, measured, limit, comparison, met)."""
    rows: list[tuple[str, float, float, str]] = []

    def ratio(a: str, b: str, key: str) -> float | None:
        if a in s and b in s:
            return s[a][key] / s[b][key]
        return None

    checks = [
        ("W1 / sqlite3 at NORMAL", ratio("statekeel", "sqlite3", "w1_total_s"), 3.0, "<="),
        ("W1 / sqlite3 at FULL", ratio("statekeel-full", "sqlite3-full", "w1_total_s"), 1.5, "<="),
        ("W1 growth (last 50 / first 50)", s.get("statekeel", {}).get("growth"), 1.2, "<="),
        ("W1 growth at FULL", s.get("statekeel-full", {}).get("growth"), 1.2, "<="),
        ("W2 / sqlite3", ratio("statekeel", "sqlite3", "w2_s"), 0.6, "<="),
        ("W3 / sqlite3", ratio("statekeel", "sqlite3", "w3_s"), 1.0, "<="),
        (
            "original design W1 / statekeel W1",
            ratio("original-design", "statekeel", "w1_total_s"),
            30.0,
            ">=",
        ),
        ("openai-agents W1 / statekeel W1", ratio("openai-agents", "statekeel", "w1_total_s"), 3.0, ">="),
        ("langgraph W1 / statekeel W1", ratio("langgraph", "statekeel", "w1_total_s"), 20.0, ">="),
        # The same, robust to disk-latency outliers: the median save instead of the total.
        ("W1 median save / sqlite3 at NORMAL", ratio("statekeel", "sqlite3", "w1_turn_median_s"), 3.0, "<="),
        (
            "W1 median save / sqlite3 at FULL",
            ratio("statekeel-full", "sqlite3-full", "w1_turn_median_s"),
            1.5,
            "<=",
        ),
        # The peers run at their defaults (synchronous=FULL): the same durability as statekeel-full.
        (
            "original design W1 / statekeel-full W1",
            ratio("original-design", "statekeel-full", "w1_total_s"),
            30.0,
            ">=",
        ),
        (
            "openai-agents W1 / statekeel-full W1",
            ratio("openai-agents", "statekeel-full", "w1_total_s"),
            3.0,
            ">=",
        ),
        ("langgraph W1 / statekeel-full W1", ratio("langgraph", "statekeel-full", "w1_total_s"), 20.0, ">="),
        ("W3 / sqlite3 at FULL", ratio("statekeel-full", "sqlite3-full", "w3_s"), 1.0, "<="),
    ]
    if big is not None:
        m = big["median"]
        checks += [
            ("large: list 100 most recent, first call (ms)", m["list100_cold_s"] * 1e3, 20.0, "<="),
            ("large: list 100 most recent, warm (ms)", m["list100_warm_s"] * 1e3, 20.0, "<="),
            (
                "large: load 2,000 msgs / same in empty store",
                m["load2000_large_s"] / m["load2000_empty_s"],
                1.1,
                "<=",
            ),
            ("large: open an up-to-date store (ms)", m["open_s"] * 1e3, 100.0, "<="),
        ]
    if rss is not None and "rss" in rss:
        samples = rss["rss"]
        early = samples[1] if len(samples) > 1 else samples[0]
        checks.append(
            (
                f"RSS growth from {early[0]} to {samples[-1][0]} sessions touched (MB)",
                (samples[-1][1] - early[1]) / 2**20,
                10.0,
                "<=",
            )
        )
    out = []
    for name, value, limit, op in checks:
        if value is None:
            continue
        met = value <= limit if op == "<=" else value >= limit
        rows.append((name, value, limit, op))
        out.append({"target": name, "measured": value, "limit": limit, "op": op, "met": met})
    return out


def print_tables(s: dict[str, dict[str, float]], big: dict[str, Any] | None, tgt: list[Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    base, base_full = s.get("sqlite3"), s.get("sqlite3-full")
    t = Table(title="W1 / W2 / W3 (medians)")
    for col in (
        "store",
        "W1 total ms",
        "turn µs (median)",
        "growth",
        "W2 ms",
        "W3 ms",
        "DB MB",
        "W1 x base",
        "W2 x base",
        "W3 x base",
    ):
        t.add_column(col, justify="right" if col != "store" else "left")
    for name, r in s.items():
        ref = base_full if name.endswith("-full") or stores_durability.get(name) == "full" else base

        def x(key: str, r: dict[str, float] = r, ref: dict[str, float] | None = ref) -> str:
            return f"{r[key] / ref[key]:.2f}" if ref else "-"

        t.add_row(
            name,
            f"{r['w1_total_s'] * 1e3:.1f}",
            f"{r['w1_turn_median_s'] * 1e6:.0f}",
            f"{r['growth']:.2f}",
            f"{r['w2_s'] * 1e3:.2f}",
            f"{r['w3_s'] * 1e3:.1f}",
            f"{r['db_bytes'] / 1e6:.1f}",
            x("w1_total_s"),
            x("w2_s"),
            x("w3_s"),
        )
    console.print(t)
    if big is not None:
        b = Table(title="statekeel with 100k sessions / 1M messages stored (medians)")
        for col in (
            "open ms",
            "list 100 first ms",
            "list 100 warm ms",
            "load 2,000 (large) ms",
            "load 2,000 (empty) ms",
            "DB MB",
        ):
            b.add_column(col, justify="right")
        m = big["median"]
        b.add_row(
            f"{m['open_s'] * 1e3:.2f}",
            f"{m['list100_cold_s'] * 1e3:.2f}",
            f"{m['list100_warm_s'] * 1e3:.2f}",
            f"{m['load2000_large_s'] * 1e3:.2f}",
            f"{m['load2000_empty_s'] * 1e3:.2f}",
            f"{big['db_bytes'] / 1e6:.0f}",
        )
        console.print(b)
    g = Table(title="Issue 6 targets")
    for col in ("target", "measured", "limit", "met"):
        g.add_column(col, justify="left" if col == "target" else "right")
    for row in tgt:
        g.add_row(
            row["target"],
            f"{row['measured']:.2f}",
            f"{row['op']} {row['limit']:g}",
            "yes" if row["met"] else "NO",
        )
    console.print(g)


stores_durability: dict[str, str] = {}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer turns and sessions: a smoke run")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per store (default 5)")
    parser.add_argument("--no-peers", action="store_true", help="statekeel and the baseline only")
    parser.add_argument("--no-large", action="store_true", help="skip the 100k-session store")
    parser.add_argument("--no-rss", action="store_true", help="skip the RSS workload")
    parser.add_argument("--chart", default=None, help="write the append-cost chart PNG here")
    parser.add_argument("--workdir", default=None, help="where stores are written (default: a temp dir)")
    args = parser.parse_args()

    repeats = args.repeats or 5
    turns, w3_sessions, w3_turns = (100, 20, 10) if args.quick else (500, 50, 20)
    big_sessions, rss_sessions = (10_000, 10_000) if args.quick else (100_000, 100_000)
    work = tempfile.mkdtemp(prefix="statekeel-bench-", dir=args.workdir)
    adapters, missing = stores.all_adapters(peers=not args.no_peers)
    for name, reason in missing.items():
        print(f"skipping {name}: {reason} (pip install -e '.[bench]')")
    stores_durability.update({a.name: a.durability for a in adapters})
    started = time.time()
    meta = {
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git": _git_rev(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.platform()}",
        "quick": args.quick,
        "repeats": repeats,
        "turns": turns,
        "w3": [w3_sessions, w3_turns],
        "message_bytes": turn_sizes(),
        "versions": {
            d: _version(d) for d in ("orjson", "aiosqlite", "openai-agents", "langgraph-checkpoint-sqlite")
        },
        "durability": {a.name: a.durability for a in adapters},
        "peers_missing": missing,
    }
    print(
        f"statekeel bench: {repeats} repeats, W1 {turns} turns, W3 {w3_sessions}x{w3_turns}, work dir {work}"
    )
    try:
        hop = asyncio.run(floor.hop_seconds())
        print(f"thread round trip (the floor of one save): {hop * 1e6:.1f} µs", flush=True)
        raw = asyncio.run(run_workloads(adapters, repeats, turns, w3_sessions, w3_turns, work))
        summary = summarize(raw)
        big = None
        if not args.no_large:
            print(f"large store: {big_sessions} sessions x 10 messages (cached in bench/.cache)", flush=True)
            path = asyncio.run(
                large.dataset(
                    big_sessions, 10, lambda d, t: print(f"\r  built {d}/{t} sessions", end="", flush=True)
                )
            )
            print()
            big = asyncio.run(large.measure(path, repeats, tempfile.mkdtemp(prefix="large-", dir=work)))
        rss = None
        if not args.no_rss:
            print(f"RSS: touching {rss_sessions} sessions in a subprocess", flush=True)
            rss = run_rss(rss_sessions, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tgt = targets(summary, big, rss)
    result = {
        "meta": meta | {"seconds": time.time() - started, "thread_round_trip_s": hop},
        "summary": summary,
        "large": big,
        "rss": rss,
        "targets": tgt,
        "w1_per_turn_median_s": per_turn_curve(raw),
        "raw": {name: {k: v for k, v in r.items() if k != "w1_per_turn_s"} for name, r in raw.items()},
    }
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    out_path = os.path.join(HERE, "results", f"{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.json")
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1)
    print_tables(summary, big, tgt)
    if rss is not None:
        print("RSS:", json.dumps(rss))
    if args.chart:
        import chart

        chart.draw(result, args.chart)
        print(f"chart: {args.chart}")
    print(f"results: {os.path.relpath(out_path)}  ({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
