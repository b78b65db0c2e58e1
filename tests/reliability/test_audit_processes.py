"""Four OS processes append to one audit log at once: the chain never forks (SQLite, PostgreSQL)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import statekeel

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


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'audit.db'}"
    return str(request.getfixturevalue("pg_migrated"))


def run_appenders(url: str) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, url, f"agent-{i}", str(PER_WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(WORKERS)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            assert out.strip() == "done"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


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
