"""What auditing task changes costs: ``python bench/audit_costs.py [--before REV] [--n 1000] [--pg URL]``.

Every task change (creation, transition, claim, step record) appends its audit entry in the same
transaction as the change. This bench times, per call (median over ``--n`` calls, every call awaited
before the next):

- ``create``: ``tasks.create`` of a queued task;
- ``claim``: ``tasks.claim`` of the next queued task (queued → running);
- ``complete``: ``tasks.transition(id, "success", worker_id=…, lease_epoch=…)`` (fenced);
- ``step``: ``tasks.step`` with a trivial function (two records: *started*, then *succeeded*);

on a SQLite file at durability normal and full (and PostgreSQL with ``--pg …/postgres``: a database is
created and dropped). With ``--before REV`` the same measurements also run on the code of git revision
``REV`` (extracted with ``git archive`` into a temporary directory and imported from there, in a child
process), round by round in alternation with the current code, so both sides share the machine's load.
Prints a table and writes ``bench/results/audit-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIGURES = ("create", "claim", "complete", "step")


async def measure(url: str, n: int, durability: str) -> dict[str, float]:
    """Median µs per call of each figure, on a fresh store at ``url``."""
    import statekeel

    times: dict[str, list[float]] = {k: [] for k in FIGURES}
    kwargs: dict[str, Any] = {} if url.startswith("postgresql") else {"durability": durability}
    async with statekeel.open_store(url, **kwargs) as store:
        tasks = store.tasks
        for i in range(n):
            t0 = time.perf_counter()
            await tasks.create(f"task {i}", status="queued")
            times["create"].append(time.perf_counter() - t0)
        for i in range(n):
            t0 = time.perf_counter()
            task = await tasks.claim("worker-1", lease_seconds=600)
            times["claim"].append(time.perf_counter() - t0)
            assert task is not None
            t0 = time.perf_counter()
            await tasks.step(task.id, "work", lambda i=i: {"i": i}, lease_epoch=task.lease_epoch)
            times["step"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await tasks.transition(task.id, "success", worker_id="worker-1", lease_epoch=task.lease_epoch)
            times["complete"].append(time.perf_counter() - t0)
        assert (await tasks.claim("worker-1")) is None
        # The audit chain's length, where the revision has one (bench/compare.py runs older ones too).
        entries = (await store.audit.verify()).count if hasattr(store, "audit") else 0
    return {**{k: statistics.median(v) * 1e6 for k, v in times.items()}, "audit_entries": entries}


def child(url: str, n: int, durability: str) -> None:
    """Run one measurement and print it as JSON (run by the parent, with its PYTHONPATH)."""
    print(json.dumps(asyncio.run(measure(url, n, durability))))


def run_side(src: str, url: str, n: int, durability: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run(
        [sys.executable, __file__, "--child", url, "--n", str(n), "--durability", durability],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def extract(rev: str, into: str) -> str:
    """The ``src`` directory of git revision ``rev``, extracted under ``into``."""
    os.makedirs(into, exist_ok=True)
    archive = os.path.join(into, "src.tar")
    subprocess.run(["git", "-C", ROOT, "archive", "-o", archive, rev, "src"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return os.path.join(into, "src")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", default=None, help="a git revision to compare with, e.g. main")
    parser.add_argument("--pg", default=None, help="admin URL of a PostgreSQL server, e.g. …/postgres")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--durability", default="normal", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.n, args.durability)
        return
    sys.path.insert(0, HERE)
    from common import pg_databases, write_results

    sides = {"now": os.path.join(ROOT, "src")}
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="statekeel-audit-") as scratch:
        if args.before is not None:
            sides["before"] = extract(args.before, os.path.join(scratch, "before"))
        targets = [("sqlite normal", "normal"), ("sqlite full", "full")]
        if args.pg:
            targets.append(("postgresql", "normal"))
        for r in range(args.rounds):
            for label, durability in targets:
                for side, src in sides.items():
                    if label == "postgresql":
                        with pg_databases(args.pg, 1) as [url]:
                            got = run_side(src, url, args.n, durability)
                    else:
                        path = os.path.join(scratch, f"{side}-{label.replace(' ', '-')}-{r}.db")
                        got = run_side(src, f"sqlite:///{path}", args.n, durability)
                    results.setdefault(label, {}).setdefault(side, []).append(got)
                    print(
                        f"round {r + 1} {label:>14} {side:>6}: "
                        + "  ".join(f"{k} {got[k]:7.0f} µs" for k in FIGURES),
                        flush=True,
                    )
    print(f"\nmedian µs per call over {args.rounds} rounds (each round's figure a median of {args.n} calls)")
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for label, by_side in results.items():
        for side, runs in by_side.items():
            med = {k: statistics.median(run[k] for run in runs) for k in FIGURES}
            summary.setdefault(label, {})[side] = med
            print(f"{label:>14} {side:>6}: " + "  ".join(f"{k} {med[k]:7.0f}" for k in FIGURES))
    write_results(
        "audit",
        {"n": args.n, "rounds": args.rounds, "before": args.before, "summary": summary, "runs": results},
    )


if __name__ == "__main__":
    main()
