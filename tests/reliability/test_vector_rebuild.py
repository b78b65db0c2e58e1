"""The derived tier under ``kill -9``: a rebuild commits each batch on its own, so a rebuild killed in the
middle leaves whole batches behind, ``lagging()`` reports exactly what is left, and the next ``rebuild()``
embeds only that."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time

import pytest

import statekeel

N = 120
BATCH = 10

CHILD = """
import asyncio, sys
import statekeel

def embed_factory(block_at):
    calls = 0
    def embed(texts):
        nonlocal calls
        calls += 1
        print(f"embedding {calls}", flush=True)
        if calls == block_at:
            sys.stdin.readline()  # parked here until the parent kills the process
        return [[float(len(t)), float(t.count("7")) + 1.0, 1.0] for t in texts]
    return embed

async def main(url, block_at, batch):
    store = await statekeel.open_store(url)
    await store.vectors.rebuild(embed_factory(int(block_at)), model="m", batch_size=int(batch))
    print("done", flush=True)

asyncio.run(main(*sys.argv[1:4]))
"""


def embed(texts: list[str]) -> list[list[float]]:
    return [[float(len(t)), float(t.count("7")) + 1.0, 1.0] for t in texts]


def run_child(url: str, block_at: int, kill_after: float | None) -> None:
    """Run a rebuild in a child and SIGKILL it: while it embeds batch ``block_at`` (``kill_after`` None),
    or at a random instant ``kill_after`` seconds after its first batch."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, str(block_at), str(BATCH)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        wanted = "embedding 1" if kill_after is not None else f"embedding {block_at}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"child ended early: {proc.stderr.read() if proc.stderr else ''}")
            if line.strip() == wanted:
                break
        if kill_after is not None:
            time.sleep(kill_after)  # a random instant: the kill may land in a write, an embed or a read
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


async def fill(url: str) -> list[statekeel.Memory]:
    async with statekeel.open_store(url) as store:
        return [
            await store.memory.put("semantic", f"k{i:03d}", f"fact {i} " + "7" * (i % 5)) for i in range(N)
        ]


async def check_and_resume(url: str, memories: list[statekeel.Memory]) -> int:
    async with statekeel.open_store(url) as store:
        stored = await store.backend.count_rows("vectors")
        assert stored % BATCH == 0, f"{stored} vectors: a batch was written in part"
        lagging = await store.vectors.lagging(limit=1000)
        assert len(lagging) == N - stored
        assert (await store.recover()).lagging_vectors == N - stored
        assert await store.vectors.rebuild(embed, model="m", batch_size=BATCH) == N - stored
        assert await store.vectors.lagging() == []
        for m in memories:
            [vec] = await store.vectors.by_source(m.id)
            assert vec.source_version == m.version
            assert list(vec.embedding) == embed([m.content])[0]
        return stored


@pytest.mark.slow
def test_a_rebuild_killed_mid_batch_resumes_with_what_still_lags(shared_url: str) -> None:
    memories = asyncio.run(fill(shared_url))
    run_child(shared_url, block_at=4, kill_after=None)
    # Three batches were committed before the fourth's embedding was interrupted.
    assert asyncio.run(check_and_resume(shared_url, memories)) == 3 * BATCH


@pytest.mark.slow
def test_a_rebuild_killed_at_a_random_instant_leaves_whole_batches(shared_url: str) -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    memories = asyncio.run(fill(shared_url))
    # Parked in the last batch's embedding, the child is still running when the kill comes however fast
    # it got there (blocking at batch N, which never comes, let an idle machine finish first).
    run_child(shared_url, block_at=N // BATCH, kill_after=random.Random(seed).uniform(0.0, 0.05))
    stored = asyncio.run(check_and_resume(shared_url, memories))
    assert 0 <= stored < N, f"seed {seed}"
