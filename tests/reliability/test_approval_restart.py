"""An approval survives ``kill -9`` of the process that granted it, stays bound to its arguments and
single-use across restarts (SQLite, PostgreSQL)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import statekeel

CHILD = """
import asyncio, os, signal, sys
import statekeel

async def main(url: str) -> None:
    store = await statekeel.open_store(url)
    approval = await store.approvals.request("task:9", "deploy", {"env": "prod", "sha": "abc"}, "agent")
    await store.approvals.decide(approval.id, True, "alice")
    print(approval.id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no close(): what returned must already be durable

asyncio.run(main(sys.argv[1]))
"""

ARGS_A = {"env": "prod", "sha": "abc"}
ARGS_B = {"env": "prod", "sha": "abd"}


async def test_an_approval_survives_kill_and_restarts_bound_to_its_args_and_single_use(
    shared_url: str,
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, shared_url], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == -9, proc.stderr
    approval_id = proc.stdout.strip()

    async with statekeel.open_store(shared_url) as store:
        assert await store.approvals.check("task:9", "deploy", ARGS_B) is None
        found = await store.approvals.check("task:9", "deploy", ARGS_A)
        assert found is not None and found.id == approval_id and found.status == "granted"
        await store.approvals.consume(approval_id, "agent")

    async with statekeel.open_store(shared_url) as store:
        with pytest.raises(statekeel.ConflictError):
            await store.approvals.consume(approval_id, "agent")
        assert await store.approvals.check("task:9", "deploy", ARGS_A) is None
        kinds = [e.kind for e in await store.audit.query(subject="task:9")]
        assert kinds == ["approval.requested", "approval.granted", "approval.consumed"]
        assert (await store.audit.verify()).ok
