"""Without numpy (the optional extra ``statekeel[vectors]`` not installed) the vector index imports, stores
and searches on its pure-Python path, with the same hits the numpy path gives."""

from __future__ import annotations

import json
import subprocess
import sys

import statekeel

SCRIPT = """
import asyncio, json, sys
sys.modules["numpy"] = None  # as if numpy were not installed: importing it raises ImportError
import statekeel
from statekeel import vectors

async def main():
    assert vectors.np is None
    async with statekeel.open_store("memory://") as store:
        assert store.vectors.engine.use_numpy is False
        for i, emb in enumerate(json.loads(sys.argv[1])):
            await store.vectors.upsert(f"v{i}", f"s{i}", emb, model="m")
        try:
            await store.vectors.search([float("nan"), 1.0, 0.0])
        except statekeel.InvalidEmbedding:
            pass
        else:
            raise AssertionError("NaN query accepted")
        hits = await store.vectors.search([1.0, 0.5, 0.25], k=4)
        print(json.dumps([[h.vec_id, h.score] for h in hits]))

asyncio.run(main())
"""

# v2 and v5 point the same way (a tie), as do v0 and v1.
DATA = [[1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [1.0, 0.5, 0.25], [0.0, 1.0, 0.0], [-1.0, 0.5, 0.0], [3, 1.5, 0.75]]


async def test_search_without_numpy_gives_the_hits_of_the_numpy_path() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(DATA)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    without = json.loads(out.stdout)
    async with statekeel.open_store("memory://") as store:
        assert store.vectors.engine.use_numpy is True  # type: ignore[attr-defined]
        for i, emb in enumerate(DATA):
            await store.vectors.upsert(f"v{i}", f"s{i}", emb, model="m")
        with_numpy = [[h.vec_id, h.score] for h in await store.vectors.search([1.0, 0.5, 0.25], k=4)]
    assert without == with_numpy
    assert [vec_id for vec_id, _ in without] == ["v2", "v5", "v0", "v1"]
