"""A second OS process of the model test: opens the store at ``URL``, and for each text ``PREFIX-0``,
``PREFIX-1``, ... (``COUNT`` of them) appends it to session ``KEY``, saves, and prints ``ack <i>`` once
the save returned. The machine kills it with SIGKILL after the acknowledgements it waits for.

    python tests/reliability/model/child.py URL FALLBACK_DIR KEY PREFIX COUNT
"""

from __future__ import annotations

import asyncio
import sys

import statekeel


async def main(url: str, fallback: str, key: str, prefix: str, count: int) -> None:
    async with statekeel.open_store(url, fallback_dir=fallback) as store:
        session = await store.sessions.get_or_create(key)
        for i in range(count):
            session.add_message("user", f"{prefix}-{i}")
            await store.sessions.save(session)
            print(f"ack {i}", flush=True)


if __name__ == "__main__":
    url, fallback, key, prefix, count = sys.argv[1:6]
    asyncio.run(main(url, fallback, key, prefix, int(count)))
