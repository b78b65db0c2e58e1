"""A 200-step LangGraph thread: storage size and ``aput`` time under StatekeelSaver and LangGraph's own
SQLite saver.

    pip install -e '.[bench]'
    python bench/langgraph_saver.py       # 5 repeats; --steps N, --repeats N; --pg URL adds PostgreSQL

The graph is a real ``StateGraph`` compiled with each saver, run with ``durability="sync"`` (each
checkpoint committed before the next step, so every ``aput`` is timed on its own). One node loops 200
times; each step appends one ~300-byte message to ``messages`` (LangGraph's add reducer: the channel holds
the whole list), bumps ``step``, and rewrites a ~20 kB ``notes`` document every 50 steps only. Per step
LangGraph saves one checkpoint (``aput``) and the node's writes (``aput_writes``).

Reported per saver: median and p95 ``aput`` time, the whole run's time, the database size on disk after
closing (WAL checkpointed), and the bytes of checkpoint data in its tables. Every run reads the thread back
and checks the final state and the length of its history, so a saver that loses a step fails the bench.

The ``+ DeltaChannel`` rows declare ``messages`` as LangGraph's ``DeltaChannel`` (beta; default snapshot
every 100 updates): checkpoints then hold a sentinel for it and the saver rebuilds the list from the stored
writes, so the growing list is no longer stored again at every step.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import operator
import os
import platform
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Annotated, Any, TypedDict

from langgraph.channels.delta import DeltaChannel
from langgraph.graph import END, START, StateGraph

from statekeel.integrations.langgraph import StatekeelSaver


def _text(seed: str, size: int) -> str:
    # hex digests: text that compresses about 2:1, as prose does, not 100:1 as a repeated letter would
    out, n = [], 0
    while n * 64 < size:
        out.append(hashlib.sha256(f"{seed}-{n}".encode()).hexdigest())
        n += 1
    return "".join(out)[:size]


NOTE = _text("notes", 20_000)


class State(TypedDict):
    messages: Annotated[list[dict[str, Any]], operator.add]
    notes: str
    step: int


def _extend(state: list[dict[str, Any]] | None, writes: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    out = list(state or [])
    for batch in writes:
        out.extend(batch)
    return out


class DeltaState(TypedDict):
    messages: Annotated[list[dict[str, Any]], DeltaChannel(_extend)]
    notes: str
    step: int


def build(steps: int, delta: bool = False) -> Any:
    def work(state: Any) -> dict[str, Any]:
        step = state["step"] + 1
        update: dict[str, Any] = {
            "step": step,
            "messages": [{"role": "assistant", "content": _text(f"m{step}", 290), "id": f"m{step}"}],
        }
        if step % 50 == 0:
            update["notes"] = f"revision {step}\n" + NOTE
        return update

    builder: Any = StateGraph(DeltaState if delta else State)
    builder.add_node("work", work)
    builder.add_edge(START, "work")
    builder.add_conditional_edges("work", lambda s: END if s["step"] >= steps else "work")
    return builder


def _table_bytes(path: str, queries: list[str]) -> int:
    conn = sqlite3.connect(path)
    try:
        return sum(conn.execute(q).fetchone()[0] or 0 for q in queries)
    finally:
        conn.close()


STATEKEEL_DATA = [
    "SELECT sum(length(checkpoint) + length(metadata) + length(channel_versions)) FROM checkpoints",
    "SELECT sum(length(blob)) FROM checkpoint_blobs",
    "SELECT sum(length(blob)) FROM checkpoint_writes",
]
LANGGRAPH_DATA = [
    "SELECT sum(length(checkpoint) + length(metadata)) FROM checkpoints",
    "SELECT sum(length(value)) FROM writes",
]


def _file_size(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


Opener = Callable[[str], AbstractAsyncContextManager[Any]]


def statekeel_opener(durability: str) -> Opener:
    def open_(directory: str) -> AbstractAsyncContextManager[Any]:
        url = f"sqlite:///{os.path.join(directory, 'statekeel.db')}"
        return StatekeelSaver.from_url(url, durability=durability, fallback_dir=directory)

    return open_


def langgraph_opener(directory: str) -> AbstractAsyncContextManager[Any]:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    return AsyncSqliteSaver.from_conn_string(os.path.join(directory, "langgraph.db"))


def postgres_opener(url: str) -> Opener:
    def open_(directory: str) -> AbstractAsyncContextManager[Any]:
        return StatekeelSaver.from_url(url)

    return open_


async def run_once(open_: Opener, directory: str, steps: int, delta: bool) -> dict[str, Any]:
    times: list[float] = []
    config = {"configurable": {"thread_id": "bench-thread"}, "recursion_limit": steps + 10}
    started = time.perf_counter()
    async with open_(directory) as saver:
        inner: Callable[..., Awaitable[Any]] = saver.aput

        async def timed_aput(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            result = await inner(*args, **kwargs)
            times.append(time.perf_counter() - t0)
            return result

        saver.aput = timed_aput
        graph = build(steps, delta).compile(checkpointer=saver)
        out = await graph.ainvoke({"messages": [], "notes": "", "step": 0}, config, durability="sync")
        total = time.perf_counter() - started
        state = await graph.aget_state(config)
        history = [s async for s in graph.aget_state_history(config)]
        # a checkpoint half way between two snapshots (every 100 updates): a walk of ~50 ancestors
        mid = next(h.config for h in history if h.metadata and h.metadata.get("step") == steps * 3 // 4)
        history_read = await _time_delta_history(saver, mid) if delta else None
        if isinstance(saver, StatekeelSaver) and saver.store.url.startswith("postgres"):
            row = await _pg_sizes(saver)
            await saver.adelete_thread("bench-thread")
        else:
            row = None
    # what a saver must give back, checked so a lossy saver cannot look fast
    assert out["step"] == steps and len(out["messages"]) == steps, out["step"]
    last = state.values["messages"][-1]  # a DeltaChannel of role dicts holds them as LangChain messages
    assert (last["id"] if isinstance(last, dict) else last.id) == f"m{steps}"
    assert state.values["notes"].startswith("revision")
    assert len(history) == steps + 2, len(history)  # the input checkpoint, step 0, and one per step
    return {"aput_s": times, "total_s": total, "sizes": row, "history_read": history_read}


async def _time_delta_history(saver: Any, config: Any) -> tuple[float, float] | None:
    """Median time to read the DeltaChannel history of a checkpoint: the saver's own
    ``aget_delta_channel_history`` and the base class's walk (one ``aget_tuple`` per ancestor)."""
    from langgraph.checkpoint.base import BaseCheckpointSaver

    if type(saver).aget_delta_channel_history is BaseCheckpointSaver.aget_delta_channel_history:
        return None  # the saver uses the walk itself

    async def median(read: Callable[[], Awaitable[Any]]) -> float:
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            await read()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    ours = await median(lambda: saver.aget_delta_channel_history(config=config, channels=["messages"]))
    walk = await median(
        lambda: BaseCheckpointSaver.aget_delta_channel_history(saver, config=config, channels=["messages"])
    )
    return ours, walk


async def _pg_sizes(saver: StatekeelSaver) -> tuple[int, int]:
    from statekeel.backends.postgres.backend import PostgresBackend

    backend = saver.store.backend
    assert isinstance(backend, PostgresBackend)
    async with backend.pool.acquire() as conn:
        # Row storage as PostgreSQL keeps it (TOAST-compressed), without pages freed by earlier repeats.
        disk = await conn.fetchval(
            "SELECT (SELECT coalesce(sum(pg_column_size(c.*)), 0) FROM checkpoints c) "
            "+ (SELECT coalesce(sum(pg_column_size(b.*)), 0) FROM checkpoint_blobs b) "
            "+ (SELECT coalesce(sum(pg_column_size(w.*)), 0) FROM checkpoint_writes w)"
        )
        data = await conn.fetchval(
            "SELECT (SELECT coalesce(sum(length(checkpoint) + length(metadata::text) "
            "+ length(channel_versions::text)), 0) FROM checkpoints) "
            "+ (SELECT coalesce(sum(length(blob)), 0) FROM checkpoint_blobs) "
            "+ (SELECT coalesce(sum(length(blob)), 0) FROM checkpoint_writes)"
        )
    return int(disk), int(data)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pg", help="also run StatekeelSaver on this PostgreSQL URL (its tables are used)")
    args = parser.parse_args()

    savers: list[tuple[str, Opener, str | None, list[str] | None, bool]] = [
        ("statekeel (sqlite, normal)", statekeel_opener("normal"), "statekeel.db", STATEKEEL_DATA, False),
        ("statekeel (sqlite, full)", statekeel_opener("full"), "statekeel.db", STATEKEEL_DATA, False),
        ("langgraph-checkpoint-sqlite", langgraph_opener, "langgraph.db", LANGGRAPH_DATA, False),
        (
            "statekeel (sqlite, normal) + DeltaChannel",
            statekeel_opener("normal"),
            "statekeel.db",
            STATEKEEL_DATA,
            True,
        ),
        (
            "langgraph-checkpoint-sqlite + DeltaChannel",
            langgraph_opener,
            "langgraph.db",
            LANGGRAPH_DATA,
            True,
        ),
    ]
    if args.pg:
        savers.append(("statekeel (postgresql)", postgres_opener(args.pg), None, None, False))
        savers.append(("statekeel (postgresql) + DeltaChannel", postgres_opener(args.pg), None, None, True))
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in savers}
    for repeat in range(args.repeats):
        order = savers[repeat % len(savers) :] + savers[: repeat % len(savers)]
        for name, open_, db, data_queries, delta in order:
            with tempfile.TemporaryDirectory() as directory:
                result = await run_once(open_, directory, args.steps, delta)
                if db is not None and data_queries is not None:
                    path = os.path.join(directory, db)
                    result["sizes"] = (_file_size(path), _table_bytes(path, data_queries))
                results[name].append(result)

    print(
        f"{args.steps}-step LangGraph thread, {args.repeats} repeats, Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}, {platform.machine()} {os.cpu_count()} cpus"
    )
    print()
    print("| saver | median aput µs | p95 aput µs | whole run ms | on disk MB | checkpoint data MB |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, runs in results.items():
        aput = [statistics.median(r["aput_s"]) for r in runs]
        p95 = [statistics.quantiles(r["aput_s"], n=20)[-1] for r in runs]
        total = [r["total_s"] for r in runs]
        disk = statistics.median(r["sizes"][0] for r in runs)
        data = statistics.median(r["sizes"][1] for r in runs)
        print(
            f"| {name} | {statistics.median(aput) * 1e6:,.0f} | {statistics.median(p95) * 1e6:,.0f} | "
            f"{statistics.median(total) * 1e3:,.0f} | {disk / 1e6:.2f} | {data / 1e6:.2f} |"
        )

    reads = {name: [r["history_read"] for r in runs] for name, runs in results.items()}
    reads = {name: rs for name, rs in reads.items() if rs and rs[0] is not None}
    if reads:
        print()
        print(f"Reading the DeltaChannel history of the checkpoint of step {args.steps * 3 // 4}:")
        print()
        print("| saver | aget_delta_channel_history ms | the base class's walk ms |")
        print("|---|---:|---:|")
        for name, rs in reads.items():
            ours = statistics.median(r[0] for r in rs)
            walk = statistics.median(r[1] for r in rs)
            print(f"| {name} | {ours * 1e3:.1f} | {walk * 1e3:.1f} |")


if __name__ == "__main__":
    asyncio.run(main())
