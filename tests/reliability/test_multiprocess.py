"""Many OS processes on one store: no lost, duplicated or interleaved messages (invariants 3 and 4).

Each test starts 4 worker processes (this file run as a script), lets them start together through a file
barrier, and then checks every row the store holds. Runs on PostgreSQL and on a SQLite file.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import statekeel
from statekeel.backends.base import NewMessage

PROCS = 4
ROLES = ("user", "assistant", "tool", "assistant")
DEADLINE_S = 180.0
# Four SQLite writers on a loaded 2-core machine may queue for the file lock longer than the default 5 s;
# this test is about what is stored, not about lock waits.
BUSY_TIMEOUT_MS = 60_000


def _content(proc: int, session: int, turn: int, k: int) -> str:
    return f"p{proc}-s{session}-t{turn}-m{k}"


def _turn(codec: Any, proc: int, session: int, turn: int) -> list[NewMessage]:
    return [
        NewMessage(role, codec.encode({"role": role, "content": _content(proc, session, turn, k)}))
        for k, role in enumerate(ROLES)
    ]


async def _barrier(barrier: Path, proc: int) -> None:
    (barrier / f"ready-{proc}").touch()
    end = time.monotonic() + 60
    while not (barrier / "go").exists():
        if time.monotonic() > end:
            raise SystemExit("no go signal within 60s")
        await asyncio.sleep(0.005)


async def _worker_sessions(url: str, barrier: Path, proc: int, sessions: int, turns: int) -> dict[str, Any]:
    """``sessions`` sessions of this process, concurrently; turns in order within each."""
    async with statekeel.open_store(url, busy_timeout_ms=BUSY_TIMEOUT_MS) as store:
        b = store.backend

        async def one(j: int) -> None:
            head = 0
            for t in range(turns):
                rec = await b.append_messages(
                    f"p{proc}-s{j}", head, _turn(store.codec, proc, j, t), create=True
                )
                head = rec.head_seq

        await _barrier(barrier, proc)
        started = time.perf_counter()
        await asyncio.gather(*(one(j) for j in range(sessions)))
        return {"turns": sessions * turns, "seconds": time.perf_counter() - started}


async def _worker_shared_cas(url: str, barrier: Path, proc: int, turns: int) -> dict[str, Any]:
    """Append turns to one shared session with the conditional append, re-reading the head on conflict."""
    async with statekeel.open_store(url, busy_timeout_ms=BUSY_TIMEOUT_MS) as store:
        b = store.backend
        await b.create_session("shared", if_missing=True)
        await _barrier(barrier, proc)
        started, conflicts, head = time.perf_counter(), 0, 0
        for t in range(turns):
            while True:
                try:
                    rec = await b.append_messages("shared", head, _turn(store.codec, proc, 0, t))
                    head = rec.head_seq
                    break
                except statekeel.ConflictError as exc:
                    conflicts += 1
                    head = exc.current  # type: ignore[attr-defined]
        return {"turns": turns, "seconds": time.perf_counter() - started, "conflicts": conflicts}


async def _worker_shared_lock(url: str, barrier: Path, proc: int, turns: int) -> dict[str, Any]:
    """Append turns to one shared session through ``sessions.open`` (lock + load + save)."""
    async with statekeel.open_store(url, busy_timeout_ms=BUSY_TIMEOUT_MS) as store:
        await _barrier(barrier, proc)
        started = time.perf_counter()
        for t in range(turns):
            async with store.sessions.open("shared", timeout=60) as session:
                call_id = f"call-{proc}-{t}"
                calls = [{"id": call_id, "type": "function", "function": {"name": "run", "arguments": "{}"}}]
                fields: list[dict[str, Any]] = [{}, {"tool_calls": calls}, {"tool_call_id": call_id}, {}]
                for k, role in enumerate(ROLES):
                    session.add_message(role, _content(proc, 0, t, k), **fields[k])
        return {"turns": turns, "seconds": time.perf_counter() - started}


async def _run_workers(tmp_path: Path, url: str, mode: str, *args: int) -> list[dict[str, Any]]:
    barrier = tmp_path / f"barrier-{mode}"
    barrier.mkdir()
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            mode,
            url,
            str(barrier),
            str(p),
            *map(str, args),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for p in range(PROCS)
    ]
    try:
        end = time.monotonic() + 60
        while len(list(barrier.glob("ready-*"))) < PROCS:
            exited = [p for p in procs if p.returncode is not None]
            if exited or time.monotonic() > end:
                pytest.fail(f"workers did not all start (exited: {[p.returncode for p in exited]})")
            await asyncio.sleep(0.01)
        (barrier / "go").touch()
        outputs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), DEADLINE_S)
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
    results = []
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err.decode(errors="replace")[-3000:]
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    return results


async def test_four_processes_with_fifty_sessions_each_lose_nothing(shared_url: str, tmp_path: Path) -> None:
    sessions, turns = 50, 5
    results = await _run_workers(tmp_path, shared_url, "sessions", sessions, turns)
    assert sum(r["turns"] for r in results) == PROCS * sessions * turns
    async with statekeel.open_store(shared_url) as store:
        page = await store.backend.list_sessions(limit=1000)
        assert len(page.items) == PROCS * sessions
        for p in range(PROCS):
            for j in range(sessions):
                loaded = await store.backend.load_session_with_messages(f"p{p}-s{j}")
                assert loaded is not None
                rec, messages = loaded
                assert rec.head_seq == turns * len(ROLES)
                assert [m.seq for m in messages] == list(range(turns * len(ROLES)))
                assert [m.payload["content"] for m in messages] == [
                    _content(p, j, t, k) for t in range(turns) for k in range(len(ROLES))
                ]


@pytest.mark.parametrize("mode", ["shared_cas", "shared_lock"])
async def test_four_processes_on_one_session_never_interleave_duplicate_or_lose_turns(
    shared_url: str, tmp_path: Path, mode: str
) -> None:
    turns = 25 if mode == "shared_cas" else 8
    await _run_workers(tmp_path, shared_url, mode, turns)
    async with statekeel.open_store(shared_url) as store:
        messages = await store.backend.read_messages("shared")
    total = PROCS * turns * len(ROLES)
    assert [m.seq for m in messages] == list(range(total))  # dense: none lost, none extra
    seen: list[tuple[int, int]] = []
    for i in range(0, total, len(ROLES)):
        chunk = [m.payload["content"] for m in messages[i : i + len(ROLES)]]
        proc, turn = int(chunk[0].split("-")[0][1:]), int(chunk[0].split("-")[2][1:])
        assert chunk == [_content(proc, 0, turn, k) for k in range(len(ROLES))]  # contiguous, in order
        assert [m.role for m in messages[i : i + len(ROLES)]] == list(ROLES)
        seen.append((proc, turn))
    assert sorted(seen) == [(p, t) for p in range(PROCS) for t in range(turns)]  # each exactly once
    for p in range(PROCS):
        assert [t for q, t in seen if q == p] == list(range(turns))  # each writer's turns in its order


def _main(argv: list[str]) -> None:
    mode, url, barrier, proc, *rest = argv
    args = [int(a) for a in rest]
    workers: dict[str, Any] = {
        "sessions": _worker_sessions,
        "shared_cas": _worker_shared_cas,
        "shared_lock": _worker_shared_lock,
    }
    result = asyncio.run(workers[mode](url, Path(barrier), int(proc), *args))
    print(json.dumps(result))


if __name__ == "__main__":
    _main(sys.argv[1:])
