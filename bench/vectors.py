"""Vector search costs: ``python bench/vectors.py [--n 100000] [--dim 384] [--pg URL]``.

- Exact cosine search over ``--n`` random vectors of dimension ``--dim`` (one model) in a SQLite file, on
  the numpy path and the pure-Python path (``ExactSearch(use_numpy=...)``, the same answers): the first
  search after open (it loads the model's vectors into the process), warm searches (median and p95 of 20
  queries; pure Python: of 3), a warm search with a metadata filter, and the first search after one more
  vector was stored (the cache reads only what changed).
- ``lagging()`` on the same store with 20,000 memories, all of them indexed: what a call costs when
  nothing lags (it never visits up-to-date sources).

Every search is checked: the numpy and Python paths must return the same hits. Prints the figures and
writes ``bench/results/vectors-<time>.json``.
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
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import statekeel  # noqa: E402
from common import pg_databases, write_results  # noqa: E402
from statekeel.backends.base import VectorWrite  # noqa: E402
from statekeel.vectors import ExactSearch, SearchRequest, to_float32  # noqa: E402

MODEL = "bench-model"


async def fill(store: statekeel.Store, n: int, dim: int, rng: np.random.Generator) -> float:
    """Store ``n`` random unit-ish vectors in batches of 1,000 (one transaction each); seconds taken."""
    began = time.perf_counter()
    for start in range(0, n, 1000):
        block = rng.standard_normal((min(1000, n - start), dim)).astype("<f4")
        writes = [
            VectorWrite(
                vec_id=f"v{start + i:07d}",
                model=MODEL,
                source_id=f"doc-{(start + i) // 4}",
                source_version=1,
                embedding=row.tobytes(),
                dim=dim,
                metadata=store.codec.encode({"shard": (start + i) % 10}),
            )
            for i, row in enumerate(block)
        ]
        await store.backend.upsert_vectors(writes, at=dt.datetime.now(dt.UTC))
    return time.perf_counter() - began


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": statistics.median(ordered) * 1000,
        "p95_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))] * 1000,
    }


async def timed(engine: ExactSearch, request: SearchRequest) -> tuple[float, list[Any]]:
    began = time.perf_counter()
    hits = await engine.search(request)
    return time.perf_counter() - began, hits


async def search_costs(url: str, n: int, dim: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    results: dict[str, Any] = {"n": n, "dim": dim}
    async with statekeel.open_store(url) as store:
        results["fill_s"] = await fill(store, n, dim, rng)
    queries = [tuple(to_float32(rng.standard_normal(dim), "q")[1]) for _ in range(21)]
    answers: dict[int, list[Any]] = {}
    for path, use_numpy, repeats in (("numpy", True, 20), ("python", False, 3)):
        async with statekeel.open_store(url) as store:
            engine = ExactSearch(store.backend, use_numpy=use_numpy)
            first, hits = await timed(engine, SearchRequest(MODEL, dim, queries[0], 10, None))
            answers.setdefault(0, hits)
            assert hits == answers[0], f"{path}: the first search differs from the other path"
            warm = []
            for i in range(1, repeats + 1):
                took, hits = await timed(engine, SearchRequest(MODEL, dim, queries[i], 10, None))
                warm.append(took)
                assert answers.setdefault(i, hits) == hits, f"{path}: query {i} differs from the other path"
            filtered = []
            for i in range(1, repeats + 1):
                took, hits = await timed(engine, SearchRequest(MODEL, dim, queries[i], 10, {"shard": 3}))
                filtered.append(took)
                assert all(h.metadata["shard"] == 3 for h in hits) and len(hits) == 10
            await store.vectors.upsert("one-more", "doc-new", rng.standard_normal(dim), model=MODEL)
            after_write, _ = await timed(engine, SearchRequest(MODEL, dim, queries[1], 10, None))
            await store.vectors.delete("one-more")
            results[path] = {
                "first_search_ms": first * 1000,
                "warm": _stats(warm),
                "warm_filtered": _stats(filtered),
                "after_one_upsert_ms": after_write * 1000,
            }
            print(path, {k: v for k, v in results[path].items()}, flush=True)
    return results


async def lagging_costs(url: str, memories: int) -> dict[str, Any]:
    async with statekeel.open_store(url) as store:
        embed = lambda texts: [[1.0, float(len(t))] for t in texts]  # noqa: E731
        for i in range(memories):
            await store.memory.put("semantic", f"k{i}", f"fact {i}")
        began = time.perf_counter()
        embedded = await store.vectors.rebuild(embed, model="lag-model", batch_size=500)
        rebuild_s = time.perf_counter() - began
        assert embedded == memories
        calls = []
        for _ in range(20):
            began = time.perf_counter()
            assert await store.vectors.lagging() == []
            calls.append(time.perf_counter() - began)
    return {"memories": memories, "rebuild_s": rebuild_s, "lagging_nothing_lags": _stats(calls)}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--memories", type=int, default=20_000)
    parser.add_argument("--pg", default=None, help="admin URL of a PostgreSQL server, e.g. …/postgres")
    args = parser.parse_args()
    results: dict[str, Any] = {"when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{os.path.join(directory, 'vectors.db')}"
        results["sqlite"] = asyncio.run(search_costs(url, args.n, args.dim, seed=1))
        lag_url = f"sqlite:///{os.path.join(directory, 'lag.db')}"
        results["sqlite"]["lagging"] = asyncio.run(lagging_costs(lag_url, args.memories))
        print("lagging", results["sqlite"]["lagging"])
    if args.pg:
        with pg_databases(args.pg, 2) as (url, lag_url):
            results["postgres"] = asyncio.run(search_costs(url, args.n, args.dim, seed=1))
            results["postgres"]["lagging"] = asyncio.run(lagging_costs(lag_url, args.memories))
            print("lagging", results["postgres"]["lagging"])
    write_results("vectors", results)


if __name__ == "__main__":
    main()
