"""Cost of encryption at rest: ``python bench/encryption.py [--turns 1000] [--pg postgresql://…/postgres]``.

One run per configuration, on a SQLite file (durability ``normal``) and, with ``--pg``, on PostgreSQL:

- save per turn: one session, a turn of four messages (bench/messages.py) then ``sessions.save``; every
  save is timed, the figure is the median over all turns; without and with ``encryption_key``, the two
  stores saving in turn;
- load: ``sessions.load`` of that session (4 x turns messages) by a store with an empty cache, median of 9
  (plain and encrypted alternated);
- the cipher alone: us to seal and to open one message of that session;
- rotation: ``rotate_encryption_key()`` of that session's messages to a new key, rows per second.

Prints the figures with the ratio encrypted / plain and writes ``bench/results/encryption-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import orjson

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import statekeel  # noqa: E402
from common import pg_databases, write_results  # noqa: E402
from messages import turn  # noqa: E402
from statekeel.codec.encryption import make_cipher  # noqa: E402

KEY = os.urandom(32)
NEW_KEY = os.urandom(32)
LOADS = 9


async def fill(plain_url: str, sealed_url: str, turns: int) -> tuple[list[float], list[float]]:
    """Save ``turns`` turns of one session in each store, alternating (a busy machine slows both alike);
    the cost of each save (us), plain and encrypted."""
    costs: tuple[list[float], list[float]] = ([], [])
    async with (
        statekeel.open_store(plain_url) as plain,
        statekeel.open_store(sealed_url, encryption_key=KEY) as sealed,
    ):
        sessions = [await store.sessions.get_or_create("agent") for store in (plain, sealed)]
        for i in range(turns):
            for store, session, saves in zip((plain, sealed), sessions, costs, strict=True):
                for m in turn(i):
                    fields = {k: v for k, v in m.items() if k not in ("role", "content")}
                    session.add_message(m["role"], m["content"], **fields)
                started = time.perf_counter()
                await store.sessions.save(session)
                saves.append((time.perf_counter() - started) * 1e6)
    return costs


async def load_ms(url: str, turns: int, key: bytes | None) -> float:
    async with statekeel.open_store(url, encryption_key=key) as store:
        started = time.perf_counter()
        loaded = await store.sessions.load("agent")
        elapsed = (time.perf_counter() - started) * 1e3
    assert loaded is not None and loaded.head_seq == 4 * turns
    return elapsed


def seal_costs(turns: int) -> dict[str, float]:
    """The cipher alone: us to seal and to open one message (codec bytes of bench/messages.py)."""
    cipher = make_cipher(KEY)
    assert cipher is not None
    raws = [orjson.dumps(m) for i in range(turns) for m in turn(i)]
    started = time.perf_counter()
    sealed = [cipher.seal(raw, "message", ("agent", seq)) for seq, raw in enumerate(raws)]
    seal_us = (time.perf_counter() - started) * 1e6 / len(raws)
    parsed = [orjson.loads(s) for s in sealed]
    started = time.perf_counter()
    for seq, value in enumerate(parsed):
        cipher.open_raw(value, "message", ("agent", seq))
    open_us = (time.perf_counter() - started) * 1e6 / len(raws)
    return {"seal_us_per_message": seal_us, "open_us_per_message": open_us}


async def compare(make_url: Callable[[str], str], turns: int) -> dict[str, Any]:
    plain_url, sealed_url = make_url("plain"), make_url("sealed")
    plain_saves, sealed_saves = await fill(plain_url, sealed_url, turns)
    plain_loads: list[float] = []
    sealed_loads: list[float] = []
    for _ in range(LOADS):  # alternated: a busy machine slows both alike
        plain_loads.append(await load_ms(plain_url, turns, None))
        sealed_loads.append(await load_ms(sealed_url, turns, KEY))
    async with statekeel.open_store(sealed_url, encryption_key=[NEW_KEY, KEY]) as store:
        started = time.perf_counter()
        report = await store.rotate_encryption_key()
        seconds = time.perf_counter() - started
    assert report.rewritten["messages"] == 4 * turns, report
    plain = {"save_us_per_turn": statistics.median(plain_saves), "load_ms": statistics.median(plain_loads)}
    sealed = {
        "save_us_per_turn": statistics.median(sealed_saves),
        "load_ms": statistics.median(sealed_loads),
        "rotation_rows_per_s": 4 * turns / seconds,
    }
    return {
        "plain": plain,
        "encrypted": sealed,
        "save_ratio": sealed["save_us_per_turn"] / plain["save_us_per_turn"],
        "load_ratio": sealed["load_ms"] / plain["load_ms"],
    }


def show(name: str, result: dict[str, Any]) -> None:
    plain, sealed = result["plain"], result["encrypted"]
    print(
        f"{name}: save per turn {plain['save_us_per_turn']:.0f} us plain, "
        f"{sealed['save_us_per_turn']:.0f} us encrypted (x{result['save_ratio']:.2f}); "
        f"load {plain['load_ms']:.1f} ms plain, "
        f"{sealed['load_ms']:.1f} ms encrypted (x{result['load_ratio']:.2f}); rotation "
        f"{sealed['rotation_rows_per_s']:.0f} rows/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--pg", help="a PostgreSQL server's admin URL (…/postgres) to measure it too")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "turns": args.turns,
        "cipher": seal_costs(args.turns),
    }
    print("cipher alone:", {k: round(v, 2) for k, v in results["cipher"].items()})
    with tempfile.TemporaryDirectory() as directory:
        results["sqlite"] = asyncio.run(
            compare(lambda name: f"sqlite:///{os.path.join(directory, name)}.db", args.turns)
        )
    show("sqlite", results["sqlite"])
    if args.pg:
        with pg_databases(args.pg, 2) as urls:
            by_name = dict(zip(("plain", "sealed"), urls, strict=True))
            results["postgres"] = asyncio.run(compare(by_name.__getitem__, args.turns))
        show("postgres", results["postgres"])
    write_results("encryption", results)


if __name__ == "__main__":
    main()
