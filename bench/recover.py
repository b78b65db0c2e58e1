"""What ``store.recover()`` costs on a large store: ``python bench/recover.py [--sizes 20000,50000,100000]``.

Each store holds ``size`` sessions of one turn (user, assistant tool call, tool result, answer) written as
the session manager writes them (no waiting calls), plus ``--open`` sessions whose last tool call was left
without a result by a process that is gone. Per size, on a fresh open of the SQLite file:

- ``repair``: the part of ``recover()`` that finds and repairs sessions with waiting tool calls (here:
  answers ``--open`` sessions), then ``again``: the same with nothing left to repair;
- ``recover``: the whole ``recover()`` with nothing left to repair; it also runs the other recovery checks,
  among them SQLite's ``integrity_check``, which reads the whole file (``integrity``: that check alone;
  ``rest``: ``recover()`` with the check left out);
- ``scan``: what finding those sessions cost before the count of waiting calls was kept on the session
  row: every active session listed and the tail of its messages read (the old ``recover()``);
- ``upgrade``: the first ``recover()`` after the migration that added the counts, which counts every
  session once from the tail of its messages (then ``again`` applies).

Medians of ``--repeats`` runs. Prints a table and writes ``bench/results/recover-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import statekeel  # noqa: E402
from messages import turn  # noqa: E402
from statekeel.backends.base import NewMessage  # noqa: E402

BATCH = 2000


async def build(path: str, sessions: int, waiting: int) -> None:
    """``sessions`` whole turns, counted as a save counts them, and ``waiting`` sessions left open."""
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        encoded = [NewMessage(m["role"], store.codec.encode(m)) for m in turn(0)]
        for start in range(0, sessions, BATCH):
            async with store.backend.atomic():
                for i in range(start, min(sessions, start + BATCH)):
                    await store.backend.append_messages(
                        f"session-{i:07d}", 0, encoded, create=True, open_calls=0
                    )
        gone = statekeel.SessionManager(store.backend, store.codec)
        for i in range(waiting):
            session = await gone.get_or_create(f"waiting-{i:03d}")
            for message in turn(i)[:2]:  # the user's question and the model's tool call
                session.add_item(message)
            await gone.save(session)
        await gone.close()  # its process is gone: its calls are answered by the next recover()


def scan(path: str) -> Callable[[Any], Awaitable[int]]:
    async def old_recover_scan(store: Any) -> int:
        n = 0
        async for record in store.sessions.iter(status="active", page_size=500):
            await store.backend.tail_messages(record.key, 200)
            n += 1
        return n

    return old_recover_scan


async def timed(path: str, fn: Callable[[Any], Awaitable[Any]]) -> tuple[float, Any]:
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        t0 = time.perf_counter()
        out = await fn(store)
        return time.perf_counter() - t0, out


async def repair_part(store: Any) -> Any:
    return await store.sessions._recover_tool_calls(True)


async def whole(store: Any) -> Any:
    return await store.recover()


async def integrity(store: Any) -> Any:
    return await store.backend.integrity_check()


async def without_integrity(store: Any) -> Any:
    async def skipped() -> list[str]:
        return []

    store.backend.integrity_check = skipped
    return await store.recover()


def forget_counts(path: str) -> None:
    """The state right after the migration that added the counts: unknown for every session."""
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE sessions SET open_calls = -1 WHERE head_seq > last_consolidated")
    conn.close()


def remove_db(path: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)


async def measure(size: int, waiting: int, repeats: int, scratch: str) -> dict[str, Any]:
    runs: dict[str, list[float]] = {
        "repair": [],
        "again": [],
        "recover": [],
        "integrity": [],
        "rest": [],
        "scan": [],
        "upgrade": [],
    }
    for _ in range(repeats):
        path = os.path.join(scratch, f"recover-{size}.db")
        remove_db(path)
        await build(path, size, waiting)
        seconds, found = await timed(path, repair_part)
        assert len(found.repaired) == waiting, f"repaired {len(found.repaired)} of {waiting}"
        runs["repair"].append(seconds)
        seconds, found = await timed(path, repair_part)
        assert not found.repaired
        runs["again"].append(seconds)
        seconds, report = await timed(path, whole)
        assert report.ok and not report.orphaned_tool_calls
        runs["recover"].append(seconds)
        seconds, problems = await timed(path, integrity)
        assert problems == []
        runs["integrity"].append(seconds)
        seconds, report = await timed(path, without_integrity)
        assert report.ok
        runs["rest"].append(seconds)
        seconds, n = await timed(path, scan(path))
        assert n == size + waiting
        runs["scan"].append(seconds)
        forget_counts(path)
        seconds, found = await timed(path, repair_part)
        assert not found.repaired
        runs["upgrade"].append(seconds)
        seconds, found = await timed(path, repair_part)
        assert not found.repaired and seconds < runs["upgrade"][-1]
    return {
        "size": size,
        "waiting": waiting,
        "runs": runs,
        "median": {k: statistics.median(v) for k, v in runs.items()},
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20000,50000,100000")
    parser.add_argument("--open", type=int, default=10, dest="waiting")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    logging.getLogger("statekeel").setLevel(logging.ERROR)  # the repairs are logged: expected here
    results = []
    with tempfile.TemporaryDirectory(prefix="statekeel-recover-") as scratch:
        for size in (int(s) for s in args.sizes.split(",")):
            results.append(await measure(size, args.waiting, args.repeats, scratch))
            m = results[-1]["median"]
            print(
                f"{size:>7} sessions: repair {m['repair'] * 1e3:8.1f} ms  again {m['again'] * 1e3:8.1f} ms  "
                f"recover {m['recover'] * 1e3:8.1f} ms  integrity {m['integrity'] * 1e3:8.1f} ms  "
                f"rest {m['rest'] * 1e3:8.1f} ms  "
                f"scan {m['scan'] * 1e3:8.1f} ms  "
                f"upgrade {m['upgrade'] * 1e3:8.1f} ms",
                flush=True,
            )
    out_dir = os.path.join(HERE, "results")
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    with open(os.path.join(out_dir, f"recover-{stamp}.json"), "w", encoding="utf-8") as fh:
        json.dump({"python": sys.version, "sqlite": sqlite3.sqlite_version, "results": results}, fh, indent=2)


if __name__ == "__main__":
    asyncio.run(main())
