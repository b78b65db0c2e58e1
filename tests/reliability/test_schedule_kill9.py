"""kill -9 of a process in its tick loop: no slot fires twice and none is lost (SQLite, PostgreSQL, MariaDB).

A slot's task and the schedule's record of the slot commit in one transaction, so a kill between the task
insert and the COMMIT cannot be observed: after it, neither is there, and the next tick fires the slot.
The child kills itself with SIGKILL right after a chosen slot's task is inserted (inside the transaction),
and the test also kills children from outside at arbitrary points of their loop.
"""

from __future__ import annotations

import datetime as dt
import random
import signal
import subprocess
import sys

import pytest

import statekeel
import statekeel.schedules.manager

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)

CHILD = """
import asyncio, datetime as dt, os, signal, sys
import statekeel
import statekeel.backends.sql.schedules as fire_ops

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
url, start, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ticking = {"k": None}
insert_task = fire_ops.insert_task

async def insert_then_maybe_die(tx, task, now):
    out = await insert_task(tx, task, now)
    if ticking["k"] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)  # the slot's task inserted, the transaction not committed
    return out

fire_ops.insert_task = insert_then_maybe_die

async def main():
    async with statekeel.open_store(url) as store:
        for k in range(start, start + 100_000):
            ticking["k"] = k
            made = await store.schedules.tick(now=T0 + dt.timedelta(seconds=k))
            print(k, len(made), flush=True)

asyncio.run(main())
"""


def _child(url: str, start: int, kill_at: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, url, str(start), str(kill_at)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lines_until_killed(proc: subprocess.Popen[str], lines: int | None) -> list[int]:
    """The ticks the child reported; with ``lines``, SIGKILL it after that many."""
    with proc:
        assert proc.stdout is not None and proc.stderr is not None
        seen: list[int] = []
        for line in proc.stdout:
            seen.append(int(line.split()[0]))
            if lines is not None and len(seen) >= lines:
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr.read())
    return seen


async def _first_unhandled(url: str) -> int:
    async with statekeel.open_store(url) as store:
        schedule = await store.schedules.get("every-second")
        assert schedule is not None
        return int((schedule.fired_through - T0).total_seconds()) + 1


@pytest.mark.timeout(300)
async def test_a_ticker_killed_at_any_point_fires_no_slot_twice_and_loses_none(
    shared_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(statekeel.schedules.manager, "utcnow", lambda: T0)
    async with statekeel.open_store(shared_url) as store:
        await store.schedules.create(
            "every-second", every=1, task="t", catch_up="all", catch_up_window=3600, overlap="queue"
        )
    rng = random.Random(20300101)
    start = 1
    for cycle in range(8):
        if cycle % 2 == 0:  # killed by itself inside the transaction of a chosen slot
            kill_at = start + rng.randrange(0, 4)
            seen = _lines_until_killed(_child(shared_url, start, kill_at), None)
            assert seen == list(range(start, kill_at))
            async with statekeel.open_store(shared_url) as store:
                schedule = await store.schedules.get("every-second")
                assert schedule is not None and schedule.fired_through < T0 + dt.timedelta(seconds=kill_at)
                slots = {t.metadata["schedule"]["slot"] for t in (await store.tasks.list(limit=10_000)).items}
                assert (T0 + dt.timedelta(seconds=kill_at)).isoformat() not in slots  # neither is there
        else:  # killed from outside, wherever it is (it may have ticked past what it printed)
            seen = _lines_until_killed(_child(shared_url, start, -1), rng.randrange(1, 12))
            assert seen[0] == start
        start = await _first_unhandled(shared_url)
    end = start + 2
    async with statekeel.open_store(shared_url) as store:
        await store.schedules.tick(now=T0 + dt.timedelta(seconds=end))
        tasks = (await store.tasks.list(limit=10_000)).items
        slots = [t.metadata["schedule"]["slot"] for t in tasks]
        assert sorted(slots) == [(T0 + dt.timedelta(seconds=k)).isoformat() for k in range(1, end + 1)]
        fired = await store.audit.query(subject="schedule:every-second", kind="schedule.fired", limit=10_000)
        assert sorted(e.data["slot"] for e in fired) == sorted(slots)  # one entry per slot, with its task
        assert (await store.audit.verify()).ok
