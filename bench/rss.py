"""Memory while an agent host touches many sessions: RSS must stay bounded by ``cache_size``.

Run as its own process (``python bench/rss.py N DIR``) so that RSS is this workload's alone. It touches
``N`` sessions through the public API — ``get_or_create``, ``add_message``, ``save`` — and prints one JSON
line with the RSS sampled every ``N / 10`` sessions.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import statekeel
from messages import turn


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def touch(n: int, directory: str, cache_size: int) -> dict[str, object]:
    url = f"sqlite:///{os.path.join(directory, 'rss.db')}"
    samples: list[tuple[int, int]] = [(0, rss_bytes())]
    step = max(1, n // 10)
    messages = turn(0)
    t0 = time.perf_counter()
    async with statekeel.open_store(url, cache_size=cache_size) as store:
        for i in range(n):
            session = await store.sessions.get_or_create(f"touch-{i:07d}")
            m = messages[i % len(messages)]
            session.add_message(m["role"], m["content"])
            await store.sessions.save(session)
            if (i + 1) % step == 0:
                samples.append((i + 1, rss_bytes()))
    return {"sessions": n, "cache_size": cache_size, "seconds": time.perf_counter() - t0, "rss": samples}


if __name__ == "__main__":
    count, where = int(sys.argv[1]), sys.argv[2]
    cache = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    print(json.dumps(asyncio.run(touch(count, where, cache))))
