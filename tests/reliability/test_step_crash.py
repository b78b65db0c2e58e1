"""``kill -9`` inside a step's ``fn``: after a restart the step is in doubt and ``fn`` ran once.

A side-effect counter file (one line per call of ``fn``) shows how often the side effect happened.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest

import statekeel
from helpers import kill9_when

CHILD = """
import asyncio, os, sys, time
import statekeel

async def main(url: str, task_id: str, step_key: str, idempotent: bool, counter: str) -> None:
    def side_effect() -> str:
        with open(counter, "a") as fh:
            fh.write("ran\\n")
            fh.flush()
            os.fsync(fh.fileno())
        time.sleep(600)  # killed in here, after the side effect, before its outcome is recorded
        return "never"

    store = await statekeel.open_store(url)
    await store.tasks.step(task_id, step_key, side_effect, idempotent=idempotent)

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5]))
"""


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def crash_inside_step(url: str, task_id: str, step_key: str, idempotent: bool, counter: Path) -> None:
    """Run the step in a child process and SIGKILL it once ``fn`` has done its side effect."""
    before = _lines(counter)
    args = [CHILD, url, task_id, step_key, "1" if idempotent else "0", os.fspath(counter)]
    kill9_when(args, lambda: _lines(counter) > before, "the step's side effect")


async def test_kill_inside_a_non_idempotent_step_leaves_it_in_doubt_after_restart(
    shared_url: str, tmp_path: Path
) -> None:
    counter = tmp_path / "charges.txt"
    async with statekeel.open_store(shared_url) as store:
        await store.tasks.create("pay", status="queued")
        task = await store.tasks.claim("w", lease_seconds=600)
        assert task is not None

    crash_inside_step(shared_url, task.id, "charge", False, counter)

    async with statekeel.open_store(shared_url) as store:
        calls: list[int] = []
        with pytest.raises(statekeel.StepInDoubt) as info:
            await store.tasks.step(task.id, "charge", lambda: calls.append(1))
        assert calls == [] and _lines(counter) == 1  # fn ran once, before the crash, and not again
        assert info.value.record.status == "started"
        # Once the task's lease is gone the step shows up for recovery.
        await store.tasks.expire_leases(now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
        assert [(s.task_id, s.step_key) for s in await store.tasks.steps_in_doubt()] == [(task.id, "charge")]
        await store.tasks.resolve_step(task.id, "charge", "succeeded", result={"charge": "ch_1"})
        assert await store.tasks.step(task.id, "charge", lambda: calls.append(1)) == {"charge": "ch_1"}
        assert calls == [] and await store.tasks.steps_in_doubt() == []


async def test_kill_inside_an_idempotent_step_reruns_it_after_restart(
    shared_url: str, tmp_path: Path
) -> None:
    counter = tmp_path / "reads.txt"
    async with statekeel.open_store(shared_url) as store:
        task = await store.tasks.transition((await store.tasks.create("read")).id, "running")

    crash_inside_step(shared_url, task.id, "fetch", True, counter)

    async with statekeel.open_store(shared_url) as store:

        def fetch() -> str:
            with counter.open("a") as fh:
                fh.write("ran\n")
            return "page"

        assert await store.tasks.step(task.id, "fetch", fetch, idempotent=True) == "page"
        assert _lines(counter) == 2
        record = await store.tasks.get_step(task.id, "fetch")
        assert record is not None and (record.status, record.attempt) == ("succeeded", 2)
