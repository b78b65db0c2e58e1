"""Four OS processes append to one audit log at once: the chain never forks (SQLite, PostgreSQL)."""

from __future__ import annotations

import sys

import statekeel
from helpers import run_together

PER_WORKER = 50
WORKERS = 4

CHILD = """
import asyncio, sys
import statekeel

async def main(url: str, name: str, n: int) -> None:
    async with statekeel.open_store(url) as store:
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range(n):
            await store.audit.append("tool.call", name, f"task:{i % 3}", {"i": i})
    print("done", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def run_appenders(url: str) -> None:
    outputs = run_together(
        [[sys.executable, "-c", CHILD, url, f"agent-{i}", str(PER_WORKER)] for i in range(WORKERS)],
        timeout=120,
    )
    for out in outputs:
        assert out.strip() == "done"


async def test_concurrent_appends_from_four_processes_form_one_chain(shared_url: str) -> None:
    async with statekeel.open_store(shared_url):
        pass  # migrate once, before the workers race to open it
    run_appenders(shared_url)
    async with statekeel.open_store(shared_url) as store:
        report = await store.audit.verify()
        assert report == statekeel.AuditVerification(ok=True, count=WORKERS * PER_WORKER)
        entries = await store.audit.query(limit=1000)
        assert [e.seq for e in entries] == list(range(1, WORKERS * PER_WORKER + 1))
        for i in range(WORKERS):
            mine = [e.data["i"] for e in entries if e.actor == f"agent-{i}"]
            assert mine == list(range(PER_WORKER))  # each writer's entries in its order, none lost
