"""Forks and rewinds across processes: a process SIGKILLed while it forks, rewinds and appends leaves
nothing half done (every fork whole, every rewind record holding exactly its tail, every history dense),
and two processes rewinding and appending one session never interleave, duplicate or lose a message."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import sys
from typing import Any

import pytest

import statekeel

WRITER = r"""
import asyncio, sys
import statekeel

async def main(url, cycle):
    async with statekeel.open_store(url) as store:
        sm = store.sessions
        s = await sm.get_or_create("root")
        i = 0
        while True:
            s.add_message("user", f"c{cycle}-{i}")
            await sm.save(s)
            if i % 3 == 2:
                rw = await sm.rewind("root", s.saved_head - 2, reason=f"cycle {cycle} turn {i}")
                print("rewound", rw.compression_id, rw.to_seq, rw.upto_seq, flush=True)
                s = await sm.load("root")
            f = await sm.fork("root", s.saved_head, new_key=f"f-{cycle}-{i}")
            print("forked", f.key, f.head_seq, flush=True)
            i += 1

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""

APPENDER = r"""
import asyncio, sys
import statekeel
from statekeel.errors import ConflictError

async def main(url, n):
    async with statekeel.open_store(url) as store:
        sm = store.sessions
        done = 0
        while done < n:
            s = await sm.load("shared")
            s.add_message("user", f"a{done}")
            try:
                await sm.save(s)
            except ConflictError:
                sm._cache.pop("shared", None)
                continue
            print("appended", f"a{done}", flush=True)
            done += 1

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""

REWINDER = r"""
import asyncio, sys
import statekeel
from statekeel.errors import ConflictError, InvalidArgument

async def main(url, n):
    async with statekeel.open_store(url) as store:
        sm = store.sessions
        done = 0
        while done < n:
            record = await store.backend.load_session("shared")
            if record.head_seq < 2:
                await asyncio.sleep(0)
                continue
            try:
                rw = await sm.rewind("shared", record.head_seq - 1, reason="undo the last turn")
            except (ConflictError, InvalidArgument):
                continue
            print("rewound", rw.compression_id, flush=True)
            done += 1

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


async def _spawn(script: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


async def _history(store: statekeel.Store, key: str) -> list[Any]:
    found = await store.backend.load_session_with_messages(key, include_archived=True)
    assert found is not None
    record, rows = found
    assert [r.seq for r in rows] == list(range(record.head_seq)), f"{key}: not dense"
    return [r.payload["content"] for r in rows]


@pytest.mark.slow
async def test_kill_9_during_forks_and_rewinds_leaves_nothing_half_done(shared_url: str) -> None:
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    forks: dict[str, int] = {}
    rewinds: dict[str, tuple[int, int]] = {}
    for cycle in range(6):
        proc = await _spawn(WRITER, shared_url, str(cycle))
        assert proc.stdout is not None
        want = rng.randint(3, 30)
        for _ in range(want):
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            if not line:
                break
            kind, key, *rest = line.decode().split()
            if kind == "forked":
                forks[key] = int(rest[0])
            else:
                rewinds[key] = (int(rest[0]), int(rest[1]))
        proc.send_signal(signal.SIGKILL)  # at once, wherever it is: mid-fork, mid-rewind, mid-save
        await proc.wait()
        assert proc.returncode == -signal.SIGKILL, (await proc.stderr.read()).decode()  # type: ignore[union-attr]
        async with statekeel.open_store(shared_url) as store:
            await _history(store, "root")
            for key, head in forks.items():
                fork = await store.sessions.load(key)
                assert fork is not None and fork.head_seq == head
                assert len(await _history(store, key)) == head
            for cid, (to_seq, upto) in rewinds.items():
                archived = await store.sessions.archived("root", cid)
                assert [a.seq for a in archived] == list(range(to_seq, upto))
            # Whatever the kill interrupted is either whole or absent: every fork row loads whole.
            page = await store.sessions.list(limit=1000)
            for record in page.items:
                await _history(store, record.key)
    assert forks and rewinds
    if shared_url.startswith("sqlite"):
        conn = sqlite3.connect(shared_url.removeprefix("sqlite:///"))
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        conn.close()


@pytest.mark.slow
async def test_two_processes_rewinding_and_appending_one_session_never_interleave(shared_url: str) -> None:
    async with statekeel.open_store(shared_url) as store:
        s = await store.sessions.get_or_create("shared")
        s.add_message("user", "start")
        await store.sessions.save(s)
    appender = await _spawn(APPENDER, shared_url, "40")
    rewinder = await _spawn(REWINDER, shared_url, "15")
    out_a, err_a = await asyncio.wait_for(appender.communicate(), 120)
    out_r, err_r = await asyncio.wait_for(rewinder.communicate(), 120)
    assert appender.returncode == 0, err_a.decode()
    assert rewinder.returncode == 0, err_r.decode()
    appended = [line.split()[1] for line in out_a.decode().splitlines()]
    rewound_ids = [line.split()[1] for line in out_r.decode().splitlines()]
    assert len(appended) == 40 and len(rewound_ids) == 15
    async with statekeel.open_store(shared_url) as store:
        live = await _history(store, "shared")
        rewound: list[Any] = []
        for cid in rewound_ids:
            # rewind(key, to_seq) takes everything from to_seq on: what was appended before it read the head
            archived = await store.sessions.archived("shared", cid)
            assert archived and [a.seq for a in archived] == list(
                range(archived[0].seq, archived[-1].seq + 1)
            )
            rewound += [a.payload["content"] for a in archived]
    # Every acknowledged append is in exactly one place: the live transcript or one rewind record.
    assert sorted(live[1:] + rewound, key=lambda c: int(c[1:])) == appended
    assert live[0] == "start"
    # The live transcript holds the appender's messages in the order it wrote them.
    assert live[1:] == sorted(live[1:], key=lambda c: int(c[1:]))
