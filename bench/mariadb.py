"""statekeel on MariaDB against the raw driver (asyncmy), and the two asyncio drivers against each other.

    python bench/mariadb.py [--repeats 3] [--server mariadb://root@127.0.0.1:3306]

- W1: one session x 500 turns, one save per turn; total time and growth (median of the last 50 turns over
  the first 50). W3: 50 sessions x 20 turns, sessions concurrent (``asyncio.gather``).
- Stores: ``statekeel-mariadb`` (``store.sessions.save`` per turn on a ``mariadb://`` store), ``asyncmy``
  (the baseline: an asyncmy pool, one transaction per append with ``executemany`` into an InnoDB messages
  table — no session row, no head check) and ``aiomysql`` (the same baseline on the other driver, when
  installed: why statekeel uses asyncmy). Same server, same durability (the server's
  ``innodb_flush_log_at_trx_commit``, reported). Each run gets a fresh database, dropped after.
- Medians of ``--repeats`` runs in one process, the order of the stores rotated each repeat.

Prints a table and writes JSON to ``bench/results/mariadb-<time>.json``.
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
from urllib.parse import urlsplit

import asyncmy
import orjson

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import statekeel
from stores import Adapter, StatekeelSessions
from workloads import W1Result, w1, w3

HERE = Path(__file__).resolve().parent
BASE = os.environ.get("STATEKEEL_BENCH_MARIADB", "mariadb://root@127.0.0.1:3306")

_TABLE = (
    "CREATE TABLE messages (session_key VARCHAR(512) NOT NULL, seq BIGINT NOT NULL, "
    "role VARCHAR(64) NOT NULL, payload LONGTEXT NOT NULL, created_at DATETIME(6) NOT NULL, "
    "PRIMARY KEY (session_key, seq)) "
    "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
)
_INSERT = "INSERT INTO messages (session_key, seq, role, payload, created_at) VALUES (%s, %s, %s, %s, %s)"


def _server(base: str) -> dict[str, Any]:
    parts = urlsplit(base)
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": parts.username or "root",
        "password": parts.password or "",
    }


async def _admin(base: str, sql: str) -> Any:
    conn = await asyncmy.connect(**_server(base), autocommit=True)
    try:
        async with conn.cursor() as cur:
            await cur.execute(sql)
            return (await cur.fetchone()) if cur.description else None
    finally:
        conn.close()


class _FreshDatabase(Adapter):
    durability = "innodb_flush_log_at_trx_commit"

    def __init__(self, base: str) -> None:
        self.base = base
        self.db = ""
        self.size = 0

    async def _create(self) -> str:
        self.db = f"sk_bench_{uuid.uuid4().hex[:10]}"
        await _admin(self.base, f"CREATE DATABASE `{self.db}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        return f"{self.base}/{self.db}"

    async def _drop(self) -> None:
        row = await _admin(
            self.base,
            "SELECT COALESCE(SUM(data_length + index_length), 0) FROM information_schema.tables "
            f"WHERE table_schema = '{self.db}'",
        )
        self.size = int(row[0])
        await _admin(self.base, f"DROP DATABASE IF EXISTS `{self.db}`")

    def db_bytes(self, directory: str) -> int:
        return self.size


class StatekeelMariaDB(StatekeelSessions, _FreshDatabase):
    name = "statekeel-mariadb"

    async def open(self, directory: str) -> None:
        self.store = await statekeel.open_store(await self._create())

    async def close(self) -> None:
        await self.store.close()
        await self._drop()


class _RawDriver(_FreshDatabase):
    """A raw driver pool: one transaction per append, the rows in one ``executemany``."""

    async def _pool(self, url: str) -> Any:
        raise NotImplementedError

    async def open(self, directory: str) -> None:
        self.pool = await self._pool(await self._create())
        async with self.pool.acquire() as conn, conn.cursor() as cur:
            await cur.execute(_TABLE)

    async def start(self, key: str) -> Any:
        return [key, 0]

    async def append_turn(self, handle: Any, messages: list[dict[str, Any]]) -> None:
        key, head = handle
        now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        rows = [(key, head + i, m["role"], orjson.dumps(m).decode(), now) for i, m in enumerate(messages)]
        async with self.pool.acquire() as conn:
            await conn.begin()
            async with conn.cursor() as cur:
                await cur.executemany(_INSERT, rows)
            await conn.commit()
        handle[1] = head + len(messages)

    async def load(self, key: str) -> list[Any]:
        async with self.pool.acquire() as conn, conn.cursor() as cur:
            await cur.execute("SELECT payload FROM messages WHERE session_key = %s ORDER BY seq", [key])
            rows = await cur.fetchall()
            await conn.commit()
        return [orjson.loads(r[0]) for r in rows]

    async def close(self) -> None:
        self.pool.close()
        await self.pool.wait_closed()
        await self._drop()


class AsyncmyBaseline(_RawDriver):
    name = "asyncmy"

    async def _pool(self, url: str) -> Any:
        return await asyncmy.create_pool(
            **_server(self.base), db=self.db, minsize=1, maxsize=10, charset="utf8mb4", autocommit=False
        )


class AiomysqlBaseline(_RawDriver):
    name = "aiomysql"

    async def _pool(self, url: str) -> Any:
        import aiomysql

        return await aiomysql.create_pool(
            **_server(self.base), db=self.db, minsize=1, maxsize=10, charset="utf8mb4", autocommit=False
        )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    base = args.server
    adapters: list[_FreshDatabase] = [StatekeelMariaDB(base), AsyncmyBaseline(base)]
    try:
        import aiomysql  # noqa: F401

        adapters.append(AiomysqlBaseline(base))
    except ImportError:
        print("aiomysql is not installed: its row is left out", file=sys.stderr)
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
    version = (await _admin(base, "SELECT VERSION()"))[0]
    flush = (await _admin(base, "SELECT @@innodb_flush_log_at_trx_commit"))[0]
    return {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "server": {"version": version, "innodb_flush_log_at_trx_commit": flush},
        "repeats": args.repeats,
        "w1_turns": args.w1_turns,
        "w3": [args.w3_sessions, args.w3_turns],
        "raw": {"w1_total_s": w1_total, "w1_growth": w1_growth, "w3_total_s": w3_total},
        "median": rows,
        "ratio_statekeel_over_asyncmy": {
            "w1_total": rows["statekeel-mariadb"]["w1_total_s"] / rows["asyncmy"]["w1_total_s"],
            "w3_total": rows["statekeel-mariadb"]["w3_total_s"] / rows["asyncmy"]["w3_total_s"],
        },
    }


def print_table(result: dict[str, Any]) -> None:
    server = result["server"]
    flush = server["innodb_flush_log_at_trx_commit"]
    print(f"MariaDB {server['version']}, innodb_flush_log_at_trx_commit={flush}")
    print(f"{'store':<19}{'W1 total s':>12}{'ms/turn':>10}{'growth':>9}{'W3 total s':>12}{'W3 turns/s':>12}")
    for name, row in result["median"].items():
        print(
            f"{name:<19}{row['w1_total_s']:>12.3f}{row['w1_ms_per_turn']:>10.2f}{row['w1_growth']:>9.2f}"
            f"{row['w3_total_s']:>12.3f}{row['w3_turns_per_s']:>12.0f}"
        )
    ratio = result["ratio_statekeel_over_asyncmy"]
    print(f"statekeel / asyncmy: W1 {ratio['w1_total']:.2f}x, W3 {ratio['w3_total']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--server", default=BASE, help="server URL without a database")
    parser.add_argument("--w1-turns", type=int, default=500)
    parser.add_argument("--w3-sessions", type=int, default=50)
    parser.add_argument("--w3-turns", type=int, default=20)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print_table(result)
    out_dir = HERE / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"mariadb-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
