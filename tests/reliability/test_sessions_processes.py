"""Two OS processes writing one session through SessionManager, on SQLite and on PostgreSQL; and two
processes that both fall back to the fallback file while the database is down."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

import statekeel
from helpers import contents, database_write_locked, run_together

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


STEPPED = """
import asyncio, sys
import statekeel

async def main(url: str, fallback_dir: str) -> None:
    async with statekeel.open_store(url, fallback_dir=fallback_dir, busy_timeout_ms=50) as store:
        session = await store.sessions.load("k")
        print("ready", flush=True)
        for line in sys.stdin:  # one step per line, answered with one line
            command, _, arg = line.strip().partition(" ")
            try:
                if command == "add":
                    session.add_message("user", arg)
                elif command == "save":
                    await store.sessions.save(session)
                else:
                    session = await store.sessions.load("k")
                print("ok", flush=True)
            except statekeel.ConflictError:
                print("conflict", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


class Stepped:
    """A writer in its own process, driven one call at a time."""

    def __init__(self, url: str, fallback_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", STEPPED, url, os.fspath(fallback_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.step() == "ready"

    def step(self, command: str | None = None) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if command is not None:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        """End its input: it leaves its loop, closes its store and exits 0."""
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0, self.proc.stderr.read()
        self.proc.stderr.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


async def test_two_processes_falling_back_at_one_head_keep_every_acknowledged_message(tmp_path: Path) -> None:
    db, fb = tmp_path / "shared.db", tmp_path / "fallback"
    url = f"sqlite:///{db}"
    async with statekeel.open_store(url) as store:
        s = await store.sessions.get_or_create("k")
        s.add_message("user", "base")
        await store.sessions.save(s)
    first, second = Stepped(url, fb), Stepped(url, fb)
    try:
        with database_write_locked(db):
            assert [first.step("add from the first"), first.step("save")] == ["ok", "ok"]  # to its file
            # The second process saves at the same head: the first one's file has it already.
            assert [second.step("add from the second"), second.step("save")] == ["ok", "conflict"]
        assert second.step("save") == "conflict"  # its file still holds what the database lacks
        assert first.step("save") == "ok"  # into the database; its file is deleted
        assert second.step("load") == "ok"
        assert [second.step("add again from the second"), second.step("save")] == ["ok", "ok"]
    finally:
        first.close()
        second.close()
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb)) as store:
        assert await contents(store, "k") == ["base", "from the first", "again from the second"]
        assert os.listdir(fb) == []
