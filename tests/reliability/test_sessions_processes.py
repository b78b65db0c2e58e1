"""Two OS processes writing one session through SessionManager, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

import statekeel
from helpers import run_together

TURNS = 500

CHILD = """
import asyncio, sys
import statekeel

async def main(url: str, tag: str, turns: int) -> None:
    async with statekeel.open_store(url, fallback_dir=sys.argv[4]) as store:
        print("ready", flush=True)
        sys.stdin.readline()  # start together, so that the two really contend
        for i in range(turns):
            async with store.sessions.open("shared", timeout=120) as s:
                s.add_message("user", f"{tag}:{i}:q")
                s.add_message("assistant", f"{tag}:{i}:a", turn=i)
            await asyncio.sleep(0.002)  # the agent thinks (an LLM call) outside the lock
    print("done", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def run_two_writers(url: str, tmp_path: Path) -> None:
    outputs = run_together(
        [
            [sys.executable, "-c", CHILD, url, tag, str(TURNS), os.fspath(tmp_path / f"fb-{tag}")]
            for tag in ("A", "B")
        ],
        timeout=240,
    )
    for out in outputs:
        assert out.strip() == "done"


async def check_whole_turns(url: str) -> None:
    async with statekeel.open_store(url) as store:
        found = await store.backend.load_session_with_messages("shared")
        assert found is not None
        record, rows = found
        assert record.head_seq == 2 * 2 * TURNS
        assert [r.seq for r in rows] == list(range(4 * TURNS))  # dense
        contents = [r.payload["content"] for r in rows]
        assert len(set(contents)) == len(contents)  # nothing duplicated
        next_turn = {"A": 0, "B": 0}
        for q, a in zip(contents[0::2], contents[1::2], strict=True):
            tag, i, kind = q.split(":")
            assert kind == "q" and a == f"{tag}:{i}:a"  # a turn is never interleaved with another
            assert int(i) == next_turn[tag]  # each writer's turns in its order, none lost
            next_turn[tag] += 1
        assert next_turn == {"A": TURNS, "B": TURNS}
        assert await store.sessions.replay_fallback() == statekeel.sessions.ReplayReport()


@pytest.mark.slow
async def test_two_processes_append_500_turns_each_to_one_sqlite_session(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    async with statekeel.open_store(url):
        pass  # create and migrate before the writers start
    await asyncio.to_thread(run_two_writers, url, tmp_path)
    await check_whole_turns(url)


@pytest.mark.slow
@pytest.mark.postgres
async def test_two_processes_append_500_turns_each_to_one_postgres_session(
    pg_migrated: str, tmp_path: Path
) -> None:
    await asyncio.to_thread(run_two_writers, pg_migrated, tmp_path)
    await check_whole_turns(pg_migrated)
