"""Session costs for the Sessions issue: ``python bench/sessions_costs.py [--turns 2000] [--repeats 20]``.

- Save cost per turn at turn 10 and at turn N (default 2,000: 8,000 messages) of one session, on a SQLite
  file at both durabilities: every save is timed; the figure is the median of the 11 saves around each turn.
- The tool-call path of one agent turn: ``add_message`` per message (the transcript check included), and
  ``sessions.run_tool`` with a trivial tool (two commits: the call with its *started* record, then the
  result with the record's outcome), median over ``--tool-calls`` calls.
- The fallback round trip: with SQLite's write lock held by another connection (``busy_timeout_ms=0``) a
  save goes to the JSONL fallback file; then ``load`` merges it; then, with the lock released,
  ``replay_fallback()`` writes it into the database. Median of ``--repeats`` rounds, 4 messages each.

Prints the figures and writes ``bench/results/sessions-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import statekeel  # noqa: E402
from common import write_results  # noqa: E402
from messages import turn  # noqa: E402


def _add(session: statekeel.Session, messages: list[dict[str, Any]]) -> None:
    for m in messages:
        fields = {k: v for k, v in m.items() if k not in ("role", "content")}
        session.add_message(m["role"], m["content"], **fields)


async def save_costs(durability: str, turns: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{os.path.join(directory, 's.db')}"
        async with statekeel.open_store(url, durability=durability) as store:
            session = await store.sessions.get_or_create("agent")
            costs: list[float] = []
            for i in range(turns + 6):
                _add(session, turn(i))
                started = time.perf_counter()
                await store.sessions.save(session)
                costs.append((time.perf_counter() - started) * 1e6)
    at = {10: costs[5:16], turns: costs[turns - 5 : turns + 6]}
    return {f"save_us_turn_{n}": statistics.median(window) for n, window in at.items()}


async def tool_costs(durability: str, calls: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{os.path.join(directory, 't.db')}"
        async with statekeel.open_store(url, durability=durability) as store:
            session = await store.sessions.get_or_create("agent")
            adds: list[float] = []
            runs: list[float] = []
            for i in range(calls):
                user, call, _result, answer = turn(i)
                started = time.perf_counter()
                _add(session, [user, call])
                adds.append((time.perf_counter() - started) * 1e6 / 2)
                started = time.perf_counter()
                await store.sessions.run_tool(session, call["tool_calls"][0]["id"], lambda: "3 passed")
                runs.append((time.perf_counter() - started) * 1e6)
                _add(session, [answer])
            await store.sessions.save(session)
            assert session.pending_calls() == [] and session.head_seq == 4 * calls
    return {"add_message_us": statistics.median(adds), "run_tool_us": statistics.median(runs)}


async def fallback_round_trip(repeats: int) -> dict[str, float]:
    # Every fallback save warns, by design; here that is the point, so keep the output readable.
    logging.getLogger("statekeel.sessions").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "f.db")
        write, load, replay = [], [], []
        async with statekeel.open_store(f"sqlite:///{path}", busy_timeout_ms=0) as store:
            for r in range(repeats):
                key = f"agent-{r}"
                session = await store.sessions.get_or_create(key)
                _add(session, turn(r))
                await store.sessions.save(session)
                _add(session, turn(r + 1))
                blocker = sqlite3.connect(path, isolation_level=None)
                blocker.execute("BEGIN IMMEDIATE")  # the database is unwritable for us now
                try:
                    started = time.perf_counter()
                    await store.sessions.save(session)  # -> fallback file
                    write.append((time.perf_counter() - started) * 1e3)
                    store.sessions._cache.clear()  # load from the backend + fallback, not memory
                    started = time.perf_counter()
                    loaded = await store.sessions.load(key)
                    load.append((time.perf_counter() - started) * 1e3)
                    assert loaded is not None and len(loaded.messages) == 8
                finally:
                    blocker.execute("ROLLBACK")
                    blocker.close()
                started = time.perf_counter()
                report = await store.sessions.replay_fallback()
                replay.append((time.perf_counter() - started) * 1e3)
                assert report.replayed.get(key) == 4, report
                record = await store.backend.load_session(key)
                assert record is not None and record.head_seq == 8
    return {
        "fallback_write_ms": statistics.median(write),
        "fallback_load_ms": statistics.median(load),
        "fallback_replay_ms": statistics.median(replay),
        "fallback_round_trip_ms": statistics.median(write)
        + statistics.median(load)
        + statistics.median(replay),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tool-calls", type=int, default=2000)
    args = parser.parse_args()
    results: dict[str, Any] = {"when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    for durability in ("normal", "full"):
        results[durability] = await save_costs(durability, args.turns)
        print(f"save per turn ({durability}):", {k: round(v, 1) for k, v in results[durability].items()})
        results[f"tools_{durability}"] = await tool_costs(durability, args.tool_calls)
        tools = results[f"tools_{durability}"]
        print(f"tool calls ({durability}):", {k: round(v, 1) for k, v in tools.items()})
    results["fallback"] = await fallback_round_trip(args.repeats)
    print("fallback round trip:", {k: round(v, 2) for k, v in results["fallback"].items()})
    write_results("sessions", results)


if __name__ == "__main__":
    asyncio.run(main())
