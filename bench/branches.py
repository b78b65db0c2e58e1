"""Branch costs: ``python bench/branches.py [--lengths 100,1000,10000] [--repeat 30] [--pg URL]``.

For each parent length N: the time of the fork's write (``backend.fork_session``: one row, whatever N:
the target is O(1) in the parent's length) and of ``sessions.fork(parent, N)`` (that write, then the load
of the Session it returns, which holds the N messages), and the time of loading (uncached) a fork of a
session of N messages that added 10 of its own, against loading a plain session of the same N + 10
messages, measured alternately in the same run (target: within 1.2x). Medians (and minimums) of
``--repeat``. Writes
``bench/results/branches-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import statekeel  # noqa: E402
from common import write_results  # noqa: E402

OWN = 10
TEXT = "a message of about a hundred bytes, as an agent's turns often are, with some words in it to fill"


async def fill(store: statekeel.Store, key: str, n: int) -> None:
    s = await store.sessions.get_or_create(key)
    for i in range(n):
        s.add_message("user" if i % 2 == 0 else "assistant", f"{TEXT} {i}")
        if len(s.unsaved()) >= 1000:
            await store.sessions.save(s)
    await store.sessions.save(s)


async def timed_load(store: statekeel.Store, key: str) -> float:
    store.sessions._cache.pop(key, None)
    began = time.perf_counter()
    s = await store.sessions.load(key)
    took = time.perf_counter() - began
    assert s is not None
    return took


async def one(url: str, n: int, repeat: int) -> dict[str, Any]:
    async with statekeel.open_store(url) as store:
        await fill(store, f"parent-{n}", n)
        await fill(store, f"plain-{n}", n + OWN)
        forks, rows = [], []
        for r in range(repeat):
            began = time.perf_counter()
            await store.backend.fork_session(f"parent-{n}", n, f"row-{n}-{r}")  # the write alone
            rows.append(time.perf_counter() - began)
            began = time.perf_counter()
            await store.sessions.fork(f"parent-{n}", n, new_key=f"fork-{n}-{r}")  # write + load the fork
            forks.append(time.perf_counter() - began)
        f = await store.sessions.load(f"fork-{n}-0")
        assert f is not None
        for i in range(OWN):
            f.add_message("user", f"{TEXT} own {i}")
        await store.sessions.save(f)
        fork_loads, plain_loads = [], []
        for _ in range(repeat):  # alternately, so both see the same machine
            fork_loads.append(await timed_load(store, f"fork-{n}-0"))
            plain_loads.append(await timed_load(store, f"plain-{n}"))
        fork_ms, row_ms = statistics.median(forks) * 1000, statistics.median(rows) * 1000
        fl, pl = statistics.median(fork_loads) * 1000, statistics.median(plain_loads) * 1000
        return {
            "n": n,
            "fork_row_ms": row_ms,
            "fork_ms": fork_ms,
            "fork_load_ms": fl,
            "plain_load_ms": pl,
            "ratio": fl / pl,
            # The fastest of each: what is left of the cost when the machine's other load is not in it.
            "fork_load_min_ms": min(fork_loads) * 1000,
            "plain_load_min_ms": min(plain_loads) * 1000,
            "ratio_min": min(fork_loads) / min(plain_loads),
        }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="100,1000,10000")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--pg", default=None, help="also run on this PostgreSQL database URL (emptied first)")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        urls = {"sqlite": f"sqlite:///{os.path.join(tmp, 'b.db')}"}
        if args.pg:
            urls["postgres"] = args.pg
        for name, url in urls.items():
            rows = []
            for n in lengths:
                row = await one(url, n, args.repeat)
                rows.append(row)
                print(
                    f"{name:8} N={n:6}: fork row {row['fork_row_ms']:.2f} ms, sessions.fork (with the "
                    f"load of the new session) {row['fork_ms']:.2f} ms; load of the fork "
                    f"{row['fork_load_ms']:.2f} ms vs a plain session {row['plain_load_ms']:.2f} ms "
                    f"(ratio {row['ratio']:.2f}; fastest {row['fork_load_min_ms']:.2f} vs "
                    f"{row['plain_load_min_ms']:.2f} ms, ratio {row['ratio_min']:.2f})"
                )
            results[name] = rows
    write_results("branches", results)


if __name__ == "__main__":
    asyncio.run(main())
