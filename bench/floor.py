"""The floor of a thread-hop design: one asyncio -> thread -> asyncio round trip doing nothing.

Every statekeel SQLite operation is one such hop (the writer thread owns the connection), so no save can
cost less than this on the machine at hand. Measured the way the writer does it: a ``queue.SimpleQueue``
put, a ``get`` on the thread, ``call_soon_threadsafe`` back.
"""

from __future__ import annotations

import asyncio
import queue
import statistics
import threading
import time
from typing import Any


async def hop_seconds(n: int = 2000) -> float:
    """Median seconds of one empty round trip, over ``n`` trips."""
    loop = asyncio.get_running_loop()
    jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def serve() -> None:
        while (future := jobs.get()) is not None:
            loop.call_soon_threadsafe(future.set_result, None)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    samples = []
    try:
        for _ in range(n):
            future = loop.create_future()
            t0 = time.perf_counter()
            jobs.put(future)
            await future
            samples.append(time.perf_counter() - t0)
    finally:
        jobs.put(None)
        thread.join()
    return statistics.median(samples)


if __name__ == "__main__":
    print(f"thread round trip: {asyncio.run(hop_seconds()) * 1e6:.1f} µs")
