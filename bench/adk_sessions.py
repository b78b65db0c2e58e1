"""Google ADK sessions: ``append_event`` and ``get_session`` under StatekeelSessionService and ADK's own
DatabaseSessionService, both on a SQLite file.

    pip install -e '.[bench]'
    python bench/adk_sessions.py        # --turns N (200)

One session gets ``turns`` turns, each the four events a tool-using turn leaves (the user's message, the
model's function call, the tool's response, the model's ~300-byte answer, one with a state delta), each
``append_event`` on the session object the previous one returned, as ADK's ``Runner`` does; after each
turn the session is read back whole (``get_session``) and with its latest 20 events
(``GetSessionConfig(num_recent_events=20)``). Each service is opened once, as an agent process does. The
last read is checked against what was appended, so a service that loses an event fails the bench.

Rows: ADK's DatabaseSessionService (``sqlite+aiosqlite``, SQLAlchemy); StatekeelSessionService at
``durability="normal"`` and ``"full"``.
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
from typing import Any

from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions import DatabaseSessionService
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types

from common import write_results
from statekeel.integrations.adk import StatekeelSessionService

ANSWER = "The tests pass. " * 19  # ~300 bytes


def turn(n: int) -> list[Event]:
    call = types.FunctionCall(id=f"call_{n}", name="run_tests", args={"path": "tests"})
    reply = types.FunctionResponse(id=f"call_{n}", name="run_tests", response={"passed": n})
    parts = [
        ("user", types.Part(text=f"turn {n}: run the tests again"), {}),
        ("agent", types.Part(function_call=call), {}),
        ("agent", types.Part(function_response=reply), {}),
        ("agent", types.Part(text=ANSWER), {"last_run": n, "user:runs": n + 1}),
    ]
    return [
        Event(
            invocation_id=f"inv_{n}",
            author=author,
            content=types.Content(role="user" if author == "user" else "model", parts=[part]),
            actions=EventActions(state_delta=delta),
        )
        for author, part, delta in parts
    ]


def ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": statistics.median(ordered) * 1000,
        "p95_ms": ordered[int(len(ordered) * 0.95) - 1] * 1000,
    }


async def measure(service: Any, turns: int) -> dict[str, Any]:
    ids = {"app_name": "bench", "user_id": "u1", "session_id": "s1"}
    session = await service.create_session(**ids)
    appends: list[float] = []
    reads_all: list[float] = []
    reads_20: list[float] = []
    expected: list[str] = []
    recent = GetSessionConfig(num_recent_events=20)
    for n in range(turns):
        for event in turn(n):
            expected.append(event.id)
            t = time.perf_counter()
            await service.append_event(session, event)
            appends.append(time.perf_counter() - t)
        t = time.perf_counter()
        everything = await service.get_session(**ids)
        reads_all.append(time.perf_counter() - t)
        t = time.perf_counter()
        await service.get_session(**ids, config=recent)
        reads_20.append(time.perf_counter() - t)
    assert [e.id for e in everything.events] == expected, "the service lost or reordered events"
    assert everything.state["last_run"] == turns - 1 and everything.state["user:runs"] == turns
    return {"append_event": ms(appends), "get_session_all": ms(reads_all), "get_session_20": ms(reads_20)}


async def run(turns: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        adk = DatabaseSessionService(f"sqlite+aiosqlite:///{os.path.join(tmp, 'adk.db')}")
        try:
            results["DatabaseSessionService (google-adk, sqlite)"] = await measure(adk, turns)
        finally:
            await adk.close()
        for durability in ("normal", "full"):
            url = f"sqlite:///{os.path.join(tmp, f'sk-{durability}.db')}"
            ours = StatekeelSessionService(url, durability=durability)
            try:
                results[f"StatekeelSessionService (sqlite, {durability})"] = await measure(ours, turns)
            finally:
                await ours.aclose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    args = parser.parse_args()
    results = asyncio.run(run(args.turns))
    base = results["DatabaseSessionService (google-adk, sqlite)"]
    print(f"{args.turns} turns of 4 events; medians (p95) in ms; ratio = statekeel / DatabaseSessionService")
    print(f"{'service':48} {'append_event':>22} {'get_session()':>22} {'get_session(20)':>22}")
    for name, row in results.items():
        cells = []
        for op in ("append_event", "get_session_all", "get_session_20"):
            ratio = row[op]["median_ms"] / base[op]["median_ms"]
            cells.append(f"{row[op]['median_ms']:6.3f} ({row[op]['p95_ms']:5.2f}) {ratio:4.1f}x")
        print(f"{name:48} " + " ".join(f"{c:>22}" for c in cells))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    write_results(
        "adk-sessions",
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
