"""Task costs for the Tasks issue: ``python bench/tasks_costs.py [--tasks 4000] [--steps 2000] [--pg URL]``.

- Claim throughput: 4 OS processes claim (and complete) queued tasks from one store until none is left;
  claims per second from the moment all four start to the last one's end. Every task must be claimed
  exactly once, or the bench fails.
- The cost of a recorded step: ``tasks.step(task_id, key, fn)`` with a trivial ``fn`` (two commits: the
  *started* record, then the outcome), median over ``--steps`` steps; and the replay of a recorded step.

SQLite file at durability normal and full; PostgreSQL too with ``--pg postgresql://…/postgres`` (a
database is created and dropped). Prints the figures and writes ``bench/results/tasks-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from typing import Any

import statekeel
from common import pg_databases, write_results

WORKERS = 4


def _claimer(url: str, worker: str, ready: Any, start: Any, out: Any) -> None:
    async def run() -> list[str]:
        claimed: list[str] = []
        async with statekeel.open_store(url) as store:
            ready.put(worker)
            start.wait()
            while (task := await store.tasks.claim(worker, lease_seconds=60)) is not None:
                await store.tasks.transition(
                    task.id, "success", worker_id=worker, lease_epoch=task.lease_epoch
                )
                claimed.append(task.id)
        return claimed

    out.put((worker, asyncio.run(run()), time.time()))


async def _queue_tasks(url: str, n: int) -> set[str]:
    async with statekeel.open_store(url) as store:
        ids = set()
        for i in range(n):
            ids.add((await store.tasks.create(f"t{i}", status="queued")).id)
        return ids


def claim_throughput(url: str, n: int) -> float:
    ids = asyncio.run(_queue_tasks(url, n))
    ctx = mp.get_context("spawn")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(url, f"w{i}", ready, start, out)) for i in range(WORKERS)]
    for p in procs:
        p.start()
    for _ in procs:  # the clock starts once every worker has imported and opened the store
        ready.get(timeout=120)
    began = time.time()
    start.set()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    claimed = [t for _, tasks, _ in results for t in tasks]
    if len(claimed) != len(set(claimed)) or set(claimed) != ids:
        raise SystemExit(f"claims were lost or duplicated: {len(claimed)} claims of {len(ids)} tasks")
    return n / (max(end for _, _, end in results) - began)


async def step_costs(url: str, steps: int, durability: str = "normal") -> dict[str, float]:
    async with statekeel.open_store(url, durability=durability) as store:
        task = await store.tasks.create("steps", status="queued")
        run, replay = [], []
        for i in range(steps):
            started = time.perf_counter()
            await store.tasks.step(task.id, f"s{i}", lambda: {"ok": True})
            run.append((time.perf_counter() - started) * 1e6)
        for i in range(min(steps, 500)):
            started = time.perf_counter()
            await store.tasks.step(task.id, f"s{i}", lambda: {"ok": False})
            replay.append((time.perf_counter() - started) * 1e6)
    return {"step_us_median": statistics.median(run), "replay_us_median": statistics.median(replay)}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=4000)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--pg", default=None, help="admin URL of a PostgreSQL server, e.g. …/postgres")
    args = parser.parse_args()
    results: dict[str, Any] = {"when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    with tempfile.TemporaryDirectory() as directory:
        for durability in ("normal", "full"):
            name = f"sqlite-{durability}"
            steps_url = f"sqlite:///{os.path.join(directory, f'steps-{durability}.db')}"
            results[name] = asyncio.run(step_costs(steps_url, args.steps, durability))
            print(name, {k: round(v, 1) for k, v in results[name].items()})
        claims_url = f"sqlite:///{os.path.join(directory, 'claims.db')}"
        results["sqlite-normal"]["claims_per_s_4_procs"] = claim_throughput(claims_url, args.tasks)
        print(
            "sqlite-normal claims/s with 4 processes:",
            round(results["sqlite-normal"]["claims_per_s_4_procs"]),
        )
        results["memory"] = asyncio.run(step_costs("memory://", args.steps))
        print("memory", {k: round(v, 1) for k, v in results["memory"].items()})
    if args.pg:
        # Two databases: the step bench's own task must not be among the tasks the claimers count.
        with pg_databases(args.pg, 2) as (steps_url, claims_url):
            results["postgres"] = asyncio.run(step_costs(steps_url, args.steps))
            results["postgres"]["claims_per_s_4_procs"] = claim_throughput(claims_url, args.tasks)
            print("postgres", {k: round(v, 1) for k, v in results["postgres"].items()})
    write_results("tasks", results)


if __name__ == "__main__":
    main()
