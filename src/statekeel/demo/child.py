"""The demo's writer process: appends agent turns through the public API until it is killed.

    python -m statekeel.demo.child sqlite:///demo.db --sessions 3

Protocol on stdout, one line each, flushed: ``ready <pid>`` once the store is open, then
``ack <session_key> <seq>`` for every message of a turn, printed only after ``save`` returned (so each
``ack`` line is a promise the store made). A turn's lines go out in one write, below the pipe's atomic
size, so a kill never leaves half a line. Resumes existing sessions where they stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from ..store import open_store
from .agent import MESSAGES_PER_TURN, session_key, turn_messages


async def write_turns(url: str, sessions: int, max_turns: int) -> int:
    """Append up to ``max_turns`` turns round-robin over ``sessions`` sessions; return the turns written."""
    out = sys.stdout
    async with open_store(url) as store:
        loaded = [await store.sessions.get_or_create(session_key(i)) for i in range(sessions)]
        out.write(f"ready {os.getpid()}\n")
        out.flush()
        for turn in range(max_turns):
            session = loaded[turn % sessions]
            first = session.head_seq
            if first % MESSAGES_PER_TURN:
                raise SystemExit(f"session {session.key} has head {first}, not a whole number of turns")
            for message in turn_messages(session.key, first):
                fields = {k: v for k, v in message.items() if k not in ("role", "content")}
                session.add_message(message["role"], message["content"], **fields)
            await store.sessions.save(session)
            out.write("".join(f"ack {session.key} {first + i}\n" for i in range(MESSAGES_PER_TURN)))
            out.flush()
    return max_turns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m statekeel.demo.child", description=__doc__)
    parser.add_argument("url", help="store URL, e.g. sqlite:///demo.db")
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--max-turns", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    if args.sessions < 1 or args.max_turns < 0:
        parser.error("--sessions must be >= 1 and --max-turns >= 0")
    asyncio.run(write_turns(args.url, args.sessions, args.max_turns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
