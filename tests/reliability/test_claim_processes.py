"""Four OS processes claim from 200 queued tasks: each task is claimed exactly once (SQLite, PostgreSQL).

The test prints the claim throughput it saw (not asserted: speed targets live in bench/).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import statekeel
from helpers import run_together

TASKS = 200
WORKERS = 4

CHILD = """
import asyncio, json, sys, time
import statekeel

async def main(url: str, name: str) -> None:
    async with statekeel.open_store(url) as store:
        print("ready", flush=True)
        sys.stdin.readline()  # start together, so that the workers really contend
        start = time.time()
        got = []
        while (task := await store.tasks.claim(name, lease_seconds=600)) is not None:
            got.append([task.id, task.lease_epoch])
        end = time.time()
    print(json.dumps({"claimed": got, "start": start, "end": end}), flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def run_workers(url: str) -> dict[str, Any]:
    names = [f"worker-{i}" for i in range(WORKERS)]
    outputs = run_together([[sys.executable, "-c", CHILD, url, name] for name in names], timeout=120)
    return {name: json.loads(out) for name, out in zip(names, outputs, strict=True)}


async def test_four_processes_claim_each_of_200_tasks_exactly_once(shared_url: str) -> None:
    async with statekeel.open_store(shared_url) as store:
        made = {(await store.tasks.create(f"t{i}", status="queued")).id for i in range(TASKS)}

    reports = await asyncio.to_thread(run_workers, shared_url)

    claimed = [(tid, name) for name, r in reports.items() for tid, _ in r["claimed"]]
    assert len(claimed) == TASKS
    assert {tid for tid, _ in claimed} == made  # every task, none twice
    assert all(epoch == 1 for r in reports.values() for _, epoch in r["claimed"])
    async with statekeel.open_store(shared_url) as store:
        for tid, name in claimed:
            task = await store.tasks.get(tid)
            assert task is not None
            assert (task.status, task.lease_owner, task.lease_epoch) == ("running", name, 1)
        assert await store.tasks.claim("late") is None
    start = min(float(r["start"]) for r in reports.values())
    end = max(float(r["end"]) for r in reports.values())
    per_worker = {name: len(r["claimed"]) for name, r in reports.items()}
    print(
        f"\nclaim throughput, {WORKERS} processes on {shared_url.split(':')[0]}: "
        f"{TASKS / (end - start):.0f} claims/s ({TASKS} in {end - start:.3f}s; per worker {per_worker})"
    )
