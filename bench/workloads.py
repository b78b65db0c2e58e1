"""W1, W2, W3 of issue 6, over any :class:`~stores.Adapter`.

- W1: one session, ``turns`` turns, one save per turn; every save is timed on its own.
- W2: load the messages W1 wrote, on a freshly opened store (so no in-process cache can answer).
- W3: ``sessions`` sessions x ``turns`` turns, sessions concurrent (``asyncio.gather``), turns in order.

Each workload checks what it reads back, so a store that loses or reorders messages fails the bench
instead of looking fast.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from messages import turn
from stores import Adapter


class BenchFailure(AssertionError):
    """A store returned something other than what was written."""


@dataclass
class W1Result:
    per_turn_s: list[float] = field(default_factory=list)
    total_s: float = 0.0
    db_bytes: int = 0

    @property
    def growth(self) -> float:
        """Median of the last 50 turns over median of the first 50."""
        n = min(50, len(self.per_turn_s) // 2)
        return statistics.median(self.per_turn_s[-n:]) / statistics.median(self.per_turn_s[:n])


def _check_messages(store: str, got: list[Any], turns: int) -> None:
    expected = [m for t in range(turns) for m in turn(t)]
    if len(got) != len(expected):
        raise BenchFailure(f"{store}: loaded {len(got)} messages, wrote {len(expected)}")
    for i in (0, 1, 2, len(expected) // 2, len(expected) - 1):
        g, e = got[i], expected[i]
        if g.get("role") != e["role"] or g.get("content") != e["content"]:
            raise BenchFailure(f"{store}: message {i} came back as {str(g)[:120]!r}")


async def w1(adapter: Adapter, directory: str, turns: int) -> W1Result:
    await adapter.open(directory)
    result = W1Result()
    try:
        handle = await adapter.start("w1")
        payloads = [turn(t) for t in range(turns)]
        clock = time.perf_counter
        started = clock()
        for messages in payloads:
            t0 = clock()
            await adapter.append_turn(handle, messages)
            result.per_turn_s.append(clock() - t0)
        result.total_s = clock() - started
    finally:
        await adapter.close()
    result.db_bytes = adapter.db_bytes(directory)
    return result


async def w2(adapter: Adapter, directory: str, turns: int) -> float:
    """Seconds to load session ``w1`` (``4 * turns`` messages) on a freshly opened store."""
    await adapter.open(directory)
    try:
        t0 = time.perf_counter()
        got = await adapter.load("w1")
        elapsed = time.perf_counter() - t0
        _check_messages(adapter.name, got, turns)
    finally:
        await adapter.close()
    return elapsed


async def w3(adapter: Adapter, directory: str, sessions: int, turns: int) -> float:
    """Seconds for ``sessions`` concurrent sessions to save ``turns`` turns each."""
    await adapter.open(directory)
    try:
        handles = [await adapter.start(f"w3-{i}") for i in range(sessions)]
        payloads = [turn(t) for t in range(turns)]

        async def one(handle: Any) -> None:
            for messages in payloads:
                await adapter.append_turn(handle, messages)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(h) for h in handles))
        elapsed = time.perf_counter() - t0
        for i in (0, sessions - 1):
            _check_messages(adapter.name, await adapter.load(f"w3-{i}"), turns)
    finally:
        await adapter.close()
    return elapsed
