"""What replication and failover cost and lose: a pg_auto_failover cluster, synchronous and asynchronous.

    python bench/failover.py [--runs 3] [--writers 8] [--seconds 4] [--base-port 55470]
                             [--pg postgresql://postgres@127.0.0.1:5432/postgres] [--storage-turns 20000]

For each mode (``sync``: the standby confirms every COMMIT, pg_auto_failover's default; ``async``:
replication-quorum false, COMMIT returns once the primary has flushed its WAL), ``scripts/pg-ha`` starts a
monitor and two nodes on loopback ports, then:

- throughput: ``--writers`` sessions saved concurrently, one turn (four messages, bench/messages.py) per
  save, for ``--seconds``; turns/s through the several-host URL. With ``--pg`` the same on one server.
- ``--runs`` failovers: the writers save (``failover_timeout=0``, so no call waits) while the primary's
  keeper and postmaster are killed with SIGKILL; after the promotion and a few more seconds of writes the
  sessions are read on the new primary. *Lost* = turns whose save the database acknowledged that are not
  there. *Window* = from the kill to the first acknowledged save begun after it. The killed node then
  rejoins (``pg-ha revive``) before the next run.
- storage: with ``--pg``, ``--storage-turns`` turns in 100 sessions, then the on-disk size of the session
  tables (``pg_total_relation_size``, after VACUUM) per million turns.

Prints a table and writes JSON to ``bench/results/failover-<time>.json``. Needs pg_autoctl (Debian's
postgresql-15-auto-failover) and root or the postgres user.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import statekeel
from common import pg_admin, pg_databases, write_results
from messages import turn

PG_HA = Path(__file__).resolve().parents[1] / "scripts" / "pg-ha"


def ha(*args: str) -> str:
    out = subprocess.run([str(PG_HA), *args], capture_output=True, text=True, timeout=300, check=False)
    if out.returncode != 0:
        raise SystemExit(f"pg-ha {' '.join(args)}: {out.stderr}{out.stdout}")
    return out.stdout.strip()


def primary(root: Path) -> tuple[str, int]:
    name, port, _ = ha("primary", str(root)).split()
    return name, int(port)


class Writers:
    """``n`` sessions saved turn after turn; what the database acknowledged, with times."""

    def __init__(self, store: statekeel.Store, n: int, tag: str) -> None:
        self.store, self.n, self.tag = store, n, tag
        self.acked: dict[str, list[int]] = {f"{tag}-{j}": [] for j in range(n)}
        self.done: list[tuple[float, float]] = []  # (start, end) of acknowledged saves
        self.errors: dict[str, int] = {}
        self.stop = False

    async def run(self) -> None:
        await asyncio.gather(*(self._one(key) for key in self.acked))

    async def _one(self, key: str) -> None:
        session = await self.store.sessions.get_or_create(key)
        i = 0
        while not self.stop:
            i += 1
            for m in turn(i):
                fields = {k: v for k, v in m.items() if k not in ("role", "content")}
                session.add_message(m["role"], m["content"], **fields, turn=i)
            started = time.time()
            try:
                await self.store.sessions.save(session)
                took = session.fallback_file is None  # else it went to the fallback file
            except statekeel.StatekeelError as exc:
                self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1
                await asyncio.sleep(0.05)
                continue
            if took:
                self.acked[key].append(i)
                self.done.append((started, time.time()))
            else:
                self.errors["saved to fallback file"] = self.errors.get("saved to fallback file", 0) + 1
                await asyncio.sleep(0.05)


async def throughput(url: str, writers: int, seconds: float, fallback: str) -> float:
    async with statekeel.open_store(url, fallback_dir=fallback) as store:
        w = Writers(store, writers, f"tp{time.time_ns()}")
        task = asyncio.create_task(w.run())
        await asyncio.sleep(1.0)  # warm up: pool and sessions created
        before = len(w.done)
        await asyncio.sleep(seconds)
        turns = len(w.done) - before
        w.stop = True
        await task
        return turns / seconds


async def one_failover(root: Path, url: str, writers: int, fallback: str) -> dict[str, Any]:
    old, _ = primary(root)
    async with statekeel.open_store(url + "&failover_timeout=0", fallback_dir=fallback) as store:
        w = Writers(store, writers, f"fo{time.time_ns()}")
        task = asyncio.create_task(w.run())
        await asyncio.sleep(2.0)
        await asyncio.to_thread(ha, "kill", str(root), old)
        killed = time.time()  # once SIGKILL was sent: a save begun before may still have landed
        while True:
            await asyncio.sleep(0.2)
            try:
                if (await asyncio.to_thread(primary, root))[0] != old:
                    break
            except SystemExit:
                pass
            if time.time() - killed > 90:
                raise SystemExit("no promotion within 90 s")
        promoted = time.time()
        await asyncio.sleep(3.0)
        w.stop = True
        await task
    after = [end for start, end in w.done if start >= killed]
    async with statekeel.open_store(url, fallback_dir=fallback + "-check") as check:
        lost = 0
        for key, acked in w.acked.items():
            s = await check.sessions.load(key, repair=False)
            have = {m.get("turn") for m in s.messages} if s is not None else set()
            lost += sum(1 for i in acked if i not in have)
    ha("revive", str(root), old)
    ha("wait", str(root), "120")
    return {
        "acked_turns": sum(len(a) for a in w.acked.values()),
        "lost_turns": lost,
        "window_s": round(min(after) - killed, 2) if after else None,
        "promotion_s": round(promoted - killed, 2),
        "errors": w.errors,
    }


async def storage(url: str, turns: int) -> dict[str, Any]:
    async with statekeel.open_store(url) as store:
        sessions = [await store.sessions.get_or_create(f"st-{j}") for j in range(100)]
        for i in range(turns):
            s = sessions[i % 100]
            for m in turn(i):
                fields = {k: v for k, v in m.items() if k not in ("role", "content")}
                s.add_message(m["role"], m["content"], **fields)
            await store.sessions.save(s)
    await pg_admin(url, "VACUUM ANALYZE")
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        size = await conn.fetchval(
            "SELECT sum(pg_total_relation_size(c)) FROM unnest($1::text[]) AS c",
            ["sessions", "messages"],
        )
    finally:
        await conn.close()
    size = int(size)
    return {"turns": turns, "bytes": size, "gb_per_million_turns": round(size / turns * 1e6 / 1e9, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--base-port", type=int, default=55470)
    ap.add_argument("--pg", default=None, help="a single server's …/postgres URL, for comparison")
    ap.add_argument("--storage-turns", type=int, default=20_000)
    ap.add_argument("--modes", default="sync,async")
    args = ap.parse_args()
    results: dict[str, Any] = {"writers": args.writers, "modes": {}}
    tmp = Path(tempfile.mkdtemp(prefix="statekeel-bench-ha-"))
    if os.geteuid() == 0:
        shutil.chown(tmp, "postgres", "postgres")
    try:
        if args.pg:
            with pg_databases(args.pg, 1) as (url,):
                tp = asyncio.run(throughput(url, args.writers, args.seconds, str(tmp / "fb-one")))
            results["one_server_turns_per_s"] = round(tp)
            with pg_databases(args.pg, 1) as (url,):
                results["storage"] = asyncio.run(storage(url, args.storage_turns))
        for n, mode in enumerate(args.modes.split(",")):
            root = tmp / f"cluster-{mode}"
            url = ha("start", str(root), str(args.base_port + 10 * n), mode)
            try:
                tp = asyncio.run(throughput(url, args.writers, args.seconds, str(tmp / f"fb-{mode}")))
                runs = [
                    asyncio.run(one_failover(root, url, args.writers, str(tmp / f"fb-{mode}-{r}")))
                    for r in range(args.runs)
                ]
            finally:
                ha("stop", str(root))
            windows = [r["window_s"] for r in runs if r["window_s"] is not None]
            results["modes"][mode] = {
                "turns_per_s": round(tp),
                "runs": runs,
                "window_p50_s": statistics.median(windows) if windows else None,
                "window_max_s": max(windows) if windows else None,
                "lost_turns": [r["lost_turns"] for r in runs],
            }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results, indent=2))
    write_results("failover", results)


if __name__ == "__main__":
    main()
