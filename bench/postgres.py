"""statekeel on PostgreSQL against raw asyncpg, and many processes on one database.

    python bench/postgres.py [--repeats 5] [--pg postgresql://postgres@127.0.0.1:5432]

- W1: one session x 500 turns, one save per turn; total time and growth (median of the last 50 turns
  over the first 50). W3: 50 sessions x 20 turns, sessions concurrent (``asyncio.gather``).
- Stores: ``statekeel-pg`` (``store.sessions.save`` per turn on a ``postgresql://`` store) and
  ``asyncpg`` (the baseline: an asyncpg pool without a reset query, one transaction per append with
  ``executemany`` into a messages table with a JSONB payload — no session row, no head check). Same
  server, same durability (the server's ``synchronous_commit``, reported). Each run gets a fresh database.
- Medians of ``--repeats`` runs in one process, the order of the stores rotated each repeat; the
  multi-process figures are the median of ``--mp-repeats`` runs.
- Multi-process: 4 OS processes x 50 sessions x 20 turns each, and 4 processes appending 50 turns each to
  one shared session with the conditional append (retry on ConflictError); turns/s, after checking that
  every message is there exactly once, in order.

Prints a table and writes JSON to ``bench/results/postgres-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import orjson

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import statekeel
from messages import turn
from statekeel.backends.base import NewMessage
from stores import Adapter, StatekeelSessions
from workloads import BenchFailure, W1Result, w1, w3

HERE = Path(__file__).resolve().parent
PG_BASE = os.environ.get("STATEKEEL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432")


async def _admin(base: str, sql: str) -> Any:
    conn = await asyncpg.connect(f"{base}/postgres", timeout=10)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


class _FreshDatabase(Adapter):
    """An adapter that creates its own database on open and drops it on close (keeping its size)."""

    durability = "synchronous_commit"

    def __init__(self, base: str) -> None:
        self.base = base
        self.db = ""
        self.size = 0

    async def _create(self) -> str:
        self.db = f"sk_bench_{uuid.uuid4().hex[:10]}"
        await _admin(self.base, f'CREATE DATABASE "{self.db}"')
        return f"{self.base}/{self.db}"

    async def _drop(self) -> None:
        self.size = int(await _admin(self.base, f"SELECT pg_database_size('{self.db}')"))
        await _admin(self.base, f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')

    def db_bytes(self, directory: str) -> int:
        return self.size


class StatekeelPg(StatekeelSessions, _FreshDatabase):
    name = "statekeel-pg"

    async def open(self, directory: str) -> None:
        self.store = await statekeel.open_store(await self._create())

    async def close(self) -> None:
        await self.store.close()
        await self._drop()


async def _no_reset(conn: asyncpg.Connection) -> None:
    pass


class AsyncpgBaseline(_FreshDatabase):
    """Raw asyncpg: what the driver and server can do with nothing on top."""

    name = "asyncpg"

    async def open(self, directory: str) -> None:
        # No reset query on release, like statekeel's pool: the cheapest correct use of the driver.
        self.pool = await asyncpg.create_pool(await self._create(), min_size=1, max_size=10, reset=_no_reset)
        await self.pool.execute(
            "CREATE TABLE messages (session_key TEXT NOT NULL, seq BIGINT NOT NULL, role TEXT NOT NULL, "
            "payload JSONB NOT NULL, created_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (session_key, seq))"
        )

    async def start(self, key: str) -> Any:
        return [key, 0]

    async def append_turn(self, handle: Any, messages: list[dict[str, Any]]) -> None:
        key, head = handle
        now = dt.datetime.now(dt.UTC)
        rows = [(key, head + i, m["role"], orjson.dumps(m).decode(), now) for i, m in enumerate(messages)]
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.executemany(
                "INSERT INTO messages (session_key, seq, role, payload, created_at) "
                "VALUES ($1, $2, $3, $4, $5)",
                rows,
            )
        handle[1] = head + len(messages)

    async def load(self, key: str) -> list[Any]:
        rows = await self.pool.fetch("SELECT payload FROM messages WHERE session_key = $1 ORDER BY seq", key)
        return [orjson.loads(r[0]) for r in rows]

    async def close(self) -> None:
        await self.pool.close()
        await self._drop()


# --- multi-process ------------------------------------------------------------------------------------


def _new_messages(codec: Any, proc: int, t: int) -> list[NewMessage]:
    out = []
    for k, m in enumerate(turn(t)):
        m = dict(m, content=f"p{proc}-t{t}-m{k}", body=m["content"])
        out.append(NewMessage(m["role"], codec.encode(m)))
    return out


async def _worker(mode: str, url: str, proc: int, sessions: int, turns: int, go_at: float) -> dict[str, Any]:
    async with statekeel.open_store(url) as store:
        b = store.backend
        if mode == "shared":
            await b.create_session("shared", if_missing=True)
        await asyncio.sleep(max(0.0, go_at - time.time()))  # start together (not a race fix)
        t0 = time.perf_counter()
        conflicts = 0
        if mode == "sessions":

            async def one(j: int) -> None:
                head = 0
                for t in range(turns):
                    rec = await b.append_messages(
                        f"p{proc}-s{j}", head, _new_messages(store.codec, proc, t), create=True
                    )
                    head = rec.head_seq

            await asyncio.gather(*(one(j) for j in range(sessions)))
        else:
            head = 0
            for t in range(turns):
                while True:
                    try:
                        head = (
                            await b.append_messages("shared", head, _new_messages(store.codec, proc, t))
                        ).head_seq
                        break
                    except statekeel.ConflictError as exc:
                        conflicts += 1
                        head = exc.current  # type: ignore[attr-defined]
        return {"seconds": time.perf_counter() - t0, "conflicts": conflicts}


async def multiprocess(base: str, mode: str, procs: int, sessions: int, turns: int) -> dict[str, Any]:
    db = f"sk_bench_mp_{uuid.uuid4().hex[:8]}"
    await _admin(base, f'CREATE DATABASE "{db}"')
    url = f"{base}/{db}"
    try:
        async with statekeel.open_store(url):
            pass  # migrate once, outside the timed part
        go_at = time.time() + 2.0
        children = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--worker",
                mode,
                url,
                str(p),
                str(sessions),
                str(turns),
                str(go_at),
                stdout=asyncio.subprocess.PIPE,
            )
            for p in range(procs)
        ]
        outs = await asyncio.wait_for(asyncio.gather(*(c.communicate() for c in children)), 600)
        results = [json.loads(o.decode().strip().splitlines()[-1]) for o, _ in outs]
        if any(c.returncode for c in children):
            raise BenchFailure(f"a {mode} worker failed")
        total_turns = procs * sessions * turns
        async with statekeel.open_store(url) as store:
            keys = (
                [f"p{p}-s{j}" for p in range(procs) for j in range(sessions)]
                if mode == "sessions"
                else ["shared"]
            )
            found = 0
            for key in keys:
                msgs = await store.backend.read_messages(key)
                if [m.seq for m in msgs] != list(range(len(msgs))):
                    raise BenchFailure(f"{key}: sequence numbers are not dense")
                ids = [m.payload["content"] for m in msgs]
                if len(set(ids)) != len(ids):
                    raise BenchFailure(f"{key}: duplicated messages")
                found += len(msgs)
            if found != total_turns * 4:
                raise BenchFailure(f"{mode}: {found} messages, expected {total_turns * 4}")
        wall = max(r["seconds"] for r in results)
        return {
            "mode": mode,
            "procs": procs,
            "sessions_per_proc": sessions,
            "turns_per_session": turns,
            "turns": total_turns,
            "seconds": wall,
            "turns_per_s": total_turns / wall,
            "conflicts": sum(r["conflicts"] for r in results),
        }
    finally:
        await _admin(base, f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


# --- main ---------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    base = args.pg
    adapters: list[_FreshDatabase] = [StatekeelPg(base), AsyncpgBaseline(base)]
    w1_total: dict[str, list[float]] = {a.name: [] for a in adapters}
    w1_growth: dict[str, list[float]] = {a.name: [] for a in adapters}
    w3_total: dict[str, list[float]] = {a.name: [] for a in adapters}
    for r in range(args.repeats):
        order = adapters[r % len(adapters) :] + adapters[: r % len(adapters)]
        for a in order:
            res: W1Result = await w1(a, "", args.w1_turns)
            w1_total[a.name].append(res.total_s)
            w1_growth[a.name].append(res.growth)
            w3_total[a.name].append(await w3(a, "", args.w3_sessions, args.w3_turns))
        print(f"repeat {r + 1}/{args.repeats} done", file=sys.stderr)
    med = statistics.median
    rows = {
        a.name: {
            "w1_total_s": med(w1_total[a.name]),
            "w1_ms_per_turn": med(w1_total[a.name]) / args.w1_turns * 1000,
            "w1_growth": med(w1_growth[a.name]),
            "w3_total_s": med(w3_total[a.name]),
            "w3_turns_per_s": args.w3_sessions * args.w3_turns / med(w3_total[a.name]),
        }
        for a in adapters
    }
    mp = []
    for mode, sessions, turns in (("sessions", 50, args.w3_turns), ("shared", 1, 50)):
        runs = [await multiprocess(base, mode, 4, sessions, turns) for _ in range(args.mp_repeats)]
        best = sorted(runs, key=lambda m: m["seconds"])[len(runs) // 2]  # the median run
        mp.append(dict(best, runs_turns_per_s=[m["turns_per_s"] for m in runs]))
    settings = {
        name: await _admin(base, f"SHOW {name}") for name in ("server_version", "synchronous_commit", "fsync")
    }
    return {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "server": settings,
        "repeats": args.repeats,
        "w1_turns": args.w1_turns,
        "w3": [args.w3_sessions, args.w3_turns],
        "raw": {"w1_total_s": w1_total, "w1_growth": w1_growth, "w3_total_s": w3_total},
        "median": rows,
        "ratio_statekeel_over_asyncpg": {
            "w1_total": rows["statekeel-pg"]["w1_total_s"] / rows["asyncpg"]["w1_total_s"],
            "w3_total": rows["statekeel-pg"]["w3_total_s"] / rows["asyncpg"]["w3_total_s"],
        },
        "multiprocess": mp,
    }


def print_table(result: dict[str, Any]) -> None:
    server = result["server"]
    print(f"PostgreSQL {server['server_version']}, synchronous_commit={server['synchronous_commit']}")
    print(f"{'store':<14}{'W1 total s':>12}{'ms/turn':>10}{'growth':>9}{'W3 total s':>12}{'W3 turns/s':>12}")
    for name, row in result["median"].items():
        print(
            f"{name:<14}{row['w1_total_s']:>12.3f}{row['w1_ms_per_turn']:>10.2f}{row['w1_growth']:>9.2f}"
            f"{row['w3_total_s']:>12.3f}{row['w3_turns_per_s']:>12.0f}"
        )
    ratio = result["ratio_statekeel_over_asyncpg"]
    print(f"statekeel / asyncpg: W1 {ratio['w1_total']:.2f}x, W3 {ratio['w3_total']:.2f}x")
    for m in result["multiprocess"]:
        print(
            f"multi-process {m['mode']}: {m['procs']} procs x {m['sessions_per_proc']} sessions x "
            f"{m['turns_per_session']} turns = {m['turns']} turns in {m['seconds']:.2f}s: "
            f"{m['turns_per_s']:.0f} turns/s ({m['conflicts']} conflicts retried)"
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        mode, url, proc, sessions, turns, go_at = sys.argv[2:8]
        out = asyncio.run(_worker(mode, url, int(proc), int(sessions), int(turns), float(go_at)))
        print(json.dumps(out))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pg", default=PG_BASE, help="server URL without a database")
    parser.add_argument("--w1-turns", type=int, default=500)
    parser.add_argument("--w3-sessions", type=int, default=50)
    parser.add_argument("--w3-turns", type=int, default=20)
    parser.add_argument("--mp-repeats", type=int, default=3)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print_table(result)
    out_dir = HERE / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"postgres-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
