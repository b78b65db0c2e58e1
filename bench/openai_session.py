"""OpenAI Agents SDK sessions: ``add_items`` and ``get_items`` under StatekeelSession and the SDK's own
SQLiteSession, on a SQLite file.

    pip install -e '.[bench]'
    python bench/openai_session.py        # --turns N (200); --pg postgresql://…/postgres adds PostgreSQL

One session gets ``turns`` turns, each one ``add_items`` of the four items a tool-using turn leaves (the
user's message, a function call, its output, the assistant's ~300-byte answer), as ``Runner.run`` saves
them; after each turn the session is read back as the SDK reads it at the start of a run: the whole
history (``get_items()``) and the latest 20 items (``get_items(20)``). Each store is opened once, as an
agent process does. The last read is checked against what was added, so a session that loses an item
fails the bench.

Rows: the SDK's SQLiteSession (WAL, ``synchronous`` at SQLite's default FULL); StatekeelSession at
``durability="normal"`` and ``"full"``, each taking the session lock per write (the default) and inside
``async with session.hold()`` (the lock taken once for the whole run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sqlite3
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import Any

from agents import SQLiteSession

from common import pg_databases, write_results
from statekeel.integrations.openai_agents import StatekeelSession

ANSWER = "The tests pass. " * 19  # ~300 bytes


def turn(n: int) -> list[dict[str, Any]]:
    call_id = f"call_{n}"
    return [
        {"role": "user", "content": f"turn {n}: run the tests again"},
        {"type": "function_call", "call_id": call_id, "name": "run_tests", "arguments": '{"path": "tests"}'},
        {"type": "function_call_output", "call_id": call_id, "output": f"{n} passed"},
        {
            "type": "message",
            "role": "assistant",
            "id": f"msg_{n}",
            "status": "completed",
            "content": [{"type": "output_text", "text": ANSWER, "annotations": []}],
        },
    ]


def ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": statistics.median(ordered) * 1000,
        "p95_ms": ordered[int(len(ordered) * 0.95) - 1] * 1000,
    }


Hold = Callable[[], AbstractAsyncContextManager[Any]]


async def measure(session: Any, turns: int, hold: Hold) -> dict[str, Any]:
    adds: list[float] = []
    reads_all: list[float] = []
    reads_20: list[float] = []
    expected: list[dict[str, Any]] = []
    async with hold():
        for n in range(turns):
            items = turn(n)
            expected.extend(items)
            t = time.perf_counter()
            await session.add_items(items)
            adds.append(time.perf_counter() - t)
            t = time.perf_counter()
            everything = await session.get_items()
            reads_all.append(time.perf_counter() - t)
            t = time.perf_counter()
            await session.get_items(20)
            reads_20.append(time.perf_counter() - t)
    assert everything == expected, "the session lost or changed items"
    return {"add_items": ms(adds), "get_items_all": ms(reads_all), "get_items_20": ms(reads_20)}


@asynccontextmanager
async def statekeel_session(url: str, durability: str) -> AsyncIterator[StatekeelSession]:
    async with StatekeelSession("bench", url, durability=durability) as session:
        yield session


async def run(turns: int, pg_url: str | None) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sdk = SQLiteSession("bench", os.path.join(tmp, "sdk.db"))
        try:
            results["SQLiteSession (openai-agents)"] = await measure(sdk, turns, nullcontext)
        finally:
            sdk.close()
        for durability in ("normal", "full"):
            for held in (False, True):
                url = f"sqlite:///{os.path.join(tmp, f'sk-{durability}-{held}.db')}"
                async with statekeel_session(url, durability) as session:
                    name = f"StatekeelSession (sqlite, {durability}{', held' if held else ''})"
                    results[name] = await measure(session, turns, session.hold if held else nullcontext)
        if pg_url is not None:
            async with StatekeelSession("bench", pg_url) as session:
                results["StatekeelSession (postgresql)"] = await measure(session, turns, nullcontext)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--pg", help="admin URL (…/postgres) of a server: the bench makes a database there")
    args = parser.parse_args()
    if args.pg:
        with pg_databases(args.pg, 1) as (url,):
            results = asyncio.run(run(args.turns, url))
    else:
        results = asyncio.run(run(args.turns, None))
    base = results["SQLiteSession (openai-agents)"]
    print(f"{args.turns} turns of 4 items; medians (p95) in ms; ratio = statekeel / SQLiteSession medians")
    print(f"{'session':48} {'add_items':>22} {'get_items()':>22} {'get_items(20)':>22}")
    for name, row in results.items():
        cells = []
        for op in ("add_items", "get_items_all", "get_items_20"):
            ratio = row[op]["median_ms"] / base[op]["median_ms"]
            cells.append(f"{row[op]['median_ms']:6.3f} ({row[op]['p95_ms']:5.2f}) {ratio:4.1f}x")
        print(f"{name:48} " + " ".join(f"{c:>22}" for c in cells))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    write_results(
        "openai-session",
        {
            "turns": args.turns,
            "git": commit.strip(),
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
