"""statekeel with a large history: 100k sessions / 1M messages already stored.

Measures what an agent host does at start and on each request against a big store:

- opening an up-to-date store (``open_store`` + ``close``-free: the open itself);
- listing the 100 most recent sessions (first call after open, then warm);
- loading one session of 2,000 messages, compared with the same session in an otherwise empty store.

The dataset is built once through the public backend API in large ``atomic()`` batches and cached in
``bench/.cache/`` (gitignored), keyed by the schema's migration checksums and its size.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import statistics
import time
from typing import Any

import statekeel
from messages import turn
from statekeel.backends.base import NewMessage
from statekeel.backends.sqlite.backend import migrations_shipped

BIG_KEY = "big-2000"
BIG_TURNS = 500
CACHE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache")


def _unlink_db(path: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)


def schema_tag() -> str:
    digest = hashlib.sha256()
    for mig in migrations_shipped():
        digest.update(f"{mig.version}:{mig.checksum};".encode())
    return digest.hexdigest()[:12]


async def _append_big(store: Any) -> None:
    codec = store.codec
    head = 0
    async with store.backend.atomic():
        for t in range(BIG_TURNS):
            batch = [NewMessage(m["role"], codec.encode(m)) for m in turn(t)]
            await store.backend.append_messages(BIG_KEY, head, batch, create=head == 0)
            head += len(batch)


async def build(path: str, sessions: int, per_session: int, progress: Any = None) -> None:
    """Write ``sessions`` sessions of ``per_session`` messages each, plus the 2,000-message session."""
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        codec = store.codec
        templates = [m for t in range(4) for m in turn(t)]
        encoded = [NewMessage(m["role"], codec.encode(m)) for m in templates]
        batch_sessions = 2000
        for start in range(0, sessions, batch_sessions):
            async with store.backend.atomic():
                for i in range(start, min(sessions, start + batch_sessions)):
                    msgs = [encoded[(i + j) % len(encoded)] for j in range(per_session)]
                    await store.backend.append_messages(f"session-{i:07d}", 0, msgs, create=True)
            if progress is not None:
                progress(min(sessions, start + batch_sessions), sessions)
        await _append_big(store)


async def dataset(sessions: int, per_session: int, progress: Any = None) -> str:
    """The path of the cached large store, building it if needed."""
    os.makedirs(CACHE_DIR, mode=0o700, exist_ok=True)
    tag = schema_tag()
    # Datasets of an older schema are never used again: do not let them pile up (hundreds of MB each).
    for name in os.listdir(CACHE_DIR):
        if name.startswith("large-") and not name.startswith(f"large-{tag}-"):
            os.unlink(os.path.join(CACHE_DIR, name))
    path = os.path.join(CACHE_DIR, f"large-{tag}-{sessions}x{per_session}.db")
    if not os.path.isfile(path):  # noqa: ASYNC240 -- a bench script, no loop to keep responsive
        tmp = path + ".building"
        _unlink_db(tmp)
        await build(tmp, sessions, per_session, progress)
        os.replace(tmp, path)
    return path


async def _list_recent(store: Any) -> Any:
    lister = getattr(store.sessions, "list", None)
    if lister is not None:
        return await lister(limit=100)
    return await store.backend.list_sessions(limit=100)


async def _timed_load(url: str) -> float:
    async with statekeel.open_store(url) as store:
        t0 = time.perf_counter()
        session = await store.sessions.load(BIG_KEY)
        elapsed = time.perf_counter() - t0
        assert session is not None and len(session.messages) == 4 * BIG_TURNS, "big session incomplete"
    return elapsed


async def measure(path: str, repeats: int, scratch: str) -> dict[str, Any]:
    url = f"sqlite:///{path}"
    opens, cold_lists, warm_lists = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        store = await statekeel.open_store(url)
        opens.append(time.perf_counter() - t0)
        try:
            t0 = time.perf_counter()
            page = await _list_recent(store)
            cold_lists.append(time.perf_counter() - t0)
            items = getattr(page, "items", page)
            assert len(items) == 100, f"listed {len(items)} sessions, expected 100"
            for _ in range(5):
                t0 = time.perf_counter()
                await _list_recent(store)
                warm_lists.append(time.perf_counter() - t0)
        finally:
            await store.close()

    # The same 2,000-message session alone in a store, loaded the same way.
    empty_path = os.path.join(scratch, "empty.db")
    _unlink_db(empty_path)
    async with statekeel.open_store(f"sqlite:///{empty_path}") as store:
        await _append_big(store)
    large_loads, empty_loads = [], []
    for r in range(repeats):
        # Alternate which store goes first so that neither always runs on a warmer machine.
        pair = [(url, large_loads), (f"sqlite:///{empty_path}", empty_loads)]
        for target, out in pair if r % 2 == 0 else reversed(pair):
            out.append(await _timed_load(target))
    shutil.rmtree(scratch, ignore_errors=True)
    med = statistics.median
    return {
        "db_bytes": os.path.getsize(path),  # noqa: ASYNC240
        "open_s": opens,
        "list100_cold_s": cold_lists,
        "list100_warm_s": warm_lists,
        "load2000_large_s": large_loads,
        "load2000_empty_s": empty_loads,
        "median": {
            "open_s": med(opens),
            "list100_cold_s": med(cold_lists),
            "list100_warm_s": med(warm_lists),
            "load2000_large_s": med(large_loads),
            "load2000_empty_s": med(empty_loads),
        },
    }


if __name__ == "__main__":  # python bench/large.py: build (or reuse) the dataset and measure it
    import sys
    import tempfile

    async def _main() -> None:
        path = await dataset(100_000, 10, lambda done, total: print(f"\rbuilt {done}/{total}", end=""))
        print()
        print(await measure(path, 5, tempfile.mkdtemp(prefix="statekeel-bench-")))

    sys.exit(asyncio.run(_main()))
