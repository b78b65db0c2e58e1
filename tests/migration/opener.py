"""A process that opens a store the moment its parent says go (used by the concurrent-open tests).

python opener.py URL NAME   # prints "ready", waits for a line on stdin, opens, writes, prints "ok N"
"""

from __future__ import annotations

import asyncio
import sys

import statekeel


async def main(url: str, name: str) -> None:
    print("ready", flush=True)
    sys.stdin.readline()
    async with statekeel.open_store(url) as store:
        session = await store.sessions.get_or_create(f"opener-{name}")
        session.add_message("user", f"hello from {name}")
        await store.sessions.save(session)
        print(f"ok {await store.backend.schema_version()}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
