"""Memory costs: ``python bench/memory.py [--puts 2000] [--memories 100000] [--namespaces 1000] [--pg URL]``.

- The cost of a ``memory.put`` with its history event, one call awaited after the other: an UPDATE of a
  live key (the row changes, its version grows, an UPDATE event is written, one transaction), an ADD of a
  new key (row and ADD event), and an identical put (read, compare, nothing written). Medians in µs.
- ``memory.query`` over a store holding ``--memories`` memories (100 scopes by 5 types, one in 20
  forgotten): the first page of 100 with no filter, by scope, by type and scope, by key, with
  ``min_confidence``, and the first 10 pages of a scope through cursors. Medians in µs per call. On
  PostgreSQL the first page is also timed right after the fill, before ``ANALYZE`` (which autovacuum
  runs within a minute of a bulk load).

- LangGraph's ``StatekeelStore`` over a store holding ``--memories`` items spread over ``--namespaces``
  namespaces (100 items each by default, added in turn so that a namespace's items are spread over the
  whole store): ``alist_namespaces(prefix=ns)`` and a search without a query that returns the 100 items
  of one namespace, each timed the way it ran before (a scan of every memory of the type, page by page,
  kept here as it was) and now (the scope index's range of the namespace). Medians in µs.
  ``--langgraph-only`` runs this part alone.

SQLite file at durability normal and full; PostgreSQL too with ``--pg postgresql://…/postgres`` (a
database is created and dropped). Prints the figures and writes ``bench/results/memory-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import statekeel
from common import pg_admin, pg_databases, write_results
from statekeel.backends.base import Page

TYPES = ("user", "environment", "semantic", "episodic", "procedural")
SCOPES = 100
QUERY_REPEATS = 200
FILL_BATCH = 1000


def _us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


async def _timed(calls: int, fn: Callable[[int], Awaitable[object]]) -> float:
    samples = []
    for i in range(calls):
        started = time.perf_counter()
        await fn(i)
        samples.append(time.perf_counter() - started)
    return _us(samples)


async def put_costs(url: str, puts: int, durability: str = "normal") -> dict[str, float]:
    async with statekeel.open_store(url, durability=durability) as store:
        mem = store.memory
        content = {"text": "the user prefers short answers", "tags": ["style", "ui"]}
        await mem.put("user", "style", content, scope="bench")
        out = {
            "put_update_us": await _timed(
                puts, lambda i: mem.put("user", "style", {**content, "n": i}, scope="bench", actor="bench")
            ),
            "put_add_us": await _timed(
                puts, lambda i: mem.put("semantic", f"fact-{i}", content, scope="bench")
            ),
            "put_identical_us": await _timed(
                puts, lambda i: mem.put("semantic", "fact-0", content, scope="bench")
            ),
        }
        memory = (await mem.query(type="user", scope="bench")).items[0]
        events = await mem.history(memory.id)
        if len(events) != puts + 1 or memory.version != puts + 1:  # the bench checks what it measured
            raise SystemExit(f"expected {puts + 1} events, found {len(events)} (version {memory.version})")
        return out


async def fill(store: statekeel.Store, n: int, rng: random.Random) -> dict[str, Any]:
    """``n`` memories over SCOPES scopes and the five types; every 20th forgotten."""
    forgotten = []
    for start in range(0, n, FILL_BATCH):
        async with store.backend.atomic():
            for i in range(start, min(n, start + FILL_BATCH)):
                m = await store.memory.put(
                    TYPES[(i // SCOPES) % len(TYPES)],
                    f"key-{i}",
                    f"memory number {i}: " + "x" * rng.randrange(20, 200),
                    scope=f"scope-{i % SCOPES}",
                    confidence=round(rng.random(), 3),
                )
                if i % 20 == 0:
                    forgotten.append(m.id)
        async with store.backend.atomic():
            for memory_id in forgotten:
                await store.memory.forget(memory_id, reason="bench", actor="bench")
        forgotten.clear()
    return {"memories": n}


async def query_costs(url: str, n: int, durability: str = "normal") -> dict[str, float]:
    rng = random.Random(7)
    async with statekeel.open_store(url, durability=durability) as store:
        began = time.perf_counter()
        await fill(store, n, rng)
        fill_s = time.perf_counter() - began
        mem = store.memory

        async def deep(i: int) -> None:
            cursor = None
            for _ in range(10):
                page = await mem.query(scope=f"scope-{i % SCOPES}", limit=100, cursor=cursor)
                cursor = page.next_cursor
            assert cursor is None or len(page.items) == 100

        cases: dict[str, Callable[[int], Awaitable[object]]] = {
            "query_first_page_us": lambda i: mem.query(limit=100),
            "query_scope_us": lambda i: mem.query(scope=f"scope-{i % SCOPES}", limit=100),
            "query_type_scope_us": lambda i: mem.query(TYPES[i % 5], f"scope-{(i * 7) % SCOPES}", limit=100),
            "query_key_us": lambda i: mem.query(key=f"key-{(i * 4999) % n}"),
            "query_min_confidence_us": lambda i: mem.query(min_confidence=0.9, limit=100),
        }
        out: dict[str, float] = {"fill_s": fill_s}
        if url.startswith("postgresql"):
            # Right after a bulk load PostgreSQL has no statistics for the table yet and may plan a scan
            # and sort; autovacuum analyzes it within a minute. Both are measured.
            out["query_first_page_before_analyze_us"] = await _timed(
                QUERY_REPEATS // 4, cases["query_first_page_us"]
            )
            await pg_admin(url, "ANALYZE")
        for name, fn in cases.items():
            page = await fn(1)
            if not isinstance(page, Page) or not page.items:
                raise SystemExit(f"{name}: the query found nothing")
            out[name] = await _timed(QUERY_REPEATS, fn)
        out["query_10_pages_of_a_scope_us"] = await _timed(QUERY_REPEATS // 4, deep)
        return out


async def _scan_before(store: statekeel.Store, keep: Callable[[Any], bool]) -> list[Any]:
    """How StatekeelStore read items before the scope-prefix query: every memory of its type, 500 a page,
    filtered here."""
    found = []
    cursor = None
    while True:
        page = await store.memory.query("semantic", limit=500, cursor=cursor)
        found += [m for m in page.items if keep(m)]
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


async def langgraph_costs(url: str, n: int, namespaces: int) -> dict[str, float]:
    from statekeel.integrations.langgraph_store import StatekeelStore

    async with statekeel.open_store(url) as store:
        began = time.perf_counter()
        for start in range(0, n, FILL_BATCH):
            async with store.backend.atomic():
                for i in range(start, min(n, start + FILL_BATCH)):
                    await store.memory.put(
                        "semantic", f"item-{i}", {"n": i}, scope=f"langgraph/users.u{i % namespaces}"
                    )
        out: dict[str, float] = {"langgraph_fill_s": time.perf_counter() - began}
        if url.startswith("postgresql"):
            await pg_admin(url, "ANALYZE")
        lg = StatekeelStore(store)
        per_namespace = n // namespaces
        wanted = f"langgraph/users.u{namespaces // 2}"
        namespace = ("users", f"u{namespaces // 2}")

        async def search_before(i: int) -> list[Any]:
            found = await _scan_before(store, lambda m: m.scope == wanted)
            return found[:per_namespace]

        async def list_before(i: int) -> list[Any]:
            found = await _scan_before(store, lambda m: m.scope.startswith(wanted))
            return sorted({m.scope for m in found})

        async def search_now(i: int) -> list[Any]:
            return await lg.asearch(namespace, limit=per_namespace)

        async def list_now(i: int) -> list[Any]:
            return await lg.alist_namespaces(prefix=namespace)

        # The bench checks that both ways find the same items.
        if [m.key for m in await search_before(0)] != [item.key for item in await search_now(0)]:
            raise SystemExit("search: the scan and the prefix query disagree")
        if len(await search_now(0)) != per_namespace or await list_now(0) != [namespace]:
            raise SystemExit("langgraph: the namespace's items or its listing are not what was written")
        if await list_before(0) != [wanted]:
            raise SystemExit("list_namespaces: the scan found other namespaces")
        out["langgraph_search_scan_us"] = await _timed(5, search_before)
        out["langgraph_search_prefix_us"] = await _timed(QUERY_REPEATS, search_now)
        out["langgraph_list_namespaces_scan_us"] = await _timed(5, list_before)
        out["langgraph_list_namespaces_prefix_us"] = await _timed(QUERY_REPEATS, list_now)
        return out


def _show(name: str, figures: dict[str, float]) -> None:
    print(name, {k: round(v, 1) for k, v in figures.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--puts", type=int, default=2000)
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--namespaces", type=int, default=1000)
    parser.add_argument("--langgraph-only", action="store_true")
    parser.add_argument("--pg", default=None, help="admin URL of a PostgreSQL server, e.g. …/postgres")
    args = parser.parse_args()
    results: dict[str, Any] = {"when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    full = not args.langgraph_only
    with tempfile.TemporaryDirectory() as directory:
        results["sqlite-normal"] = {}
        for durability in ("normal", "full") if full else ():
            name = f"sqlite-{durability}"
            url = f"sqlite:///{os.path.join(directory, f'puts-{durability}.db')}"
            results[name] = asyncio.run(put_costs(url, args.puts, durability))
            _show(name, results[name])
        if full:
            url = f"sqlite:///{os.path.join(directory, 'query.db')}"
            results["sqlite-normal"].update(asyncio.run(query_costs(url, args.memories)))
        url = f"sqlite:///{os.path.join(directory, 'langgraph.db')}"
        results["sqlite-normal"].update(asyncio.run(langgraph_costs(url, args.memories, args.namespaces)))
        _show("sqlite-normal", results["sqlite-normal"])
    if args.pg:
        with pg_databases(args.pg, 3) as (puts_url, query_url, langgraph_url):
            results["postgres"] = {}
            if full:
                results["postgres"].update(asyncio.run(put_costs(puts_url, args.puts)))
                results["postgres"].update(asyncio.run(query_costs(query_url, args.memories)))
            results["postgres"].update(
                asyncio.run(langgraph_costs(langgraph_url, args.memories, args.namespaces))
            )
            _show("postgres", results["postgres"])
    write_results("memory", results)


if __name__ == "__main__":
    main()
