"""Erasure cost: ``python bench/erase.py [--sessions 100000] [--subject-sessions 10] [--pg URL]``.

A store of ``--sessions`` sessions (4 messages each), ``--subject-sessions`` of which name the subject in
their metadata (the others name other people), plus 20 memories in the subject's scope, is erased with
``store.erase()``. Reported: the erasure's seconds, the dry run's, the number of batches and the longest
one (how long a batch held its transaction: on SQLite the write lock; finding the subject's sessions by
their metadata reads the whole table, on a snapshot, without it). Writes ``bench/results/erase-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import statekeel  # noqa: E402
from common import pg_databases, write_results  # noqa: E402

SUBJECT = "user:alice"
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


async def fill(url: str, sessions: int, theirs: int) -> float:
    """Rows go in through the verbatim row access (import_rows), 5,000 sessions a transaction."""
    began = time.perf_counter()
    step = max(1, sessions // theirs)
    async with statekeel.open_store(url) as store:
        backend = store.backend
        for start in range(0, sessions, 5000):
            rows: list[tuple[Any, ...]] = []
            messages: list[tuple[Any, ...]] = []
            for n in range(start, min(sessions, start + 5000)):
                who = SUBJECT if n % step == 0 and n // step < theirs else f"user:{n}"
                key = f"chat-{n:07d}"
                meta = f'{{"subject": "{who}"}}'
                # key, status, metadata, last_consolidated, head, version, created, updated, open_calls,
                # calls_owner, write_id, parent_key, parent_seq, rewinds
                rows.append((key, "active", meta, 0, 4, 2, T0, T0, 0, None, None, None, None, 0))
                for seq in range(4):
                    payload = f'{{"role": "user", "content": "message {seq} of {key} by {who}"}}'
                    messages.append((key, seq, "user", payload, T0, None))  # no usage
            async with backend.atomic():
                await backend.import_rows("sessions", rows)
                await backend.import_rows("messages", messages)
        for i in range(20):
            await store.memory.put("user", f"fact-{i}", f"fact {i} about alice", scope=SUBJECT)
    return time.perf_counter() - began


async def measure(url: str, theirs: int) -> dict[str, Any]:
    async with statekeel.open_store(url) as store:
        began = time.perf_counter()
        dry = await store.erase(SUBJECT, dry_run=True, actor="bench", reason="dry run")
        dry_seconds = time.perf_counter() - began
        report = await store.erase(SUBJECT, actor="bench", reason="bench")
        assert report.sessions == theirs == dry.sessions, (report.sessions, dry.sessions)
        assert report.messages == 4 * theirs and report.memories == 20
        return {
            "seconds": round(report.seconds, 3),
            "dry_run_seconds": round(dry_seconds, 3),
            "batches": report.batches,
            "longest_batch_ms": round(report.longest_batch_seconds * 1000, 2),
            "sessions": report.sessions,
            "messages": report.messages,
            "memories": report.memories,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--subject-sessions", type=int, default=10)
    parser.add_argument("--pg", default=None, metavar="URL", help="also on PostgreSQL (…/postgres)")
    args = parser.parse_args()
    results: dict[str, Any] = {"sessions": args.sessions, "subject_sessions": args.subject_sessions}
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{os.path.join(tmp, 'erase.db')}"
        results["sqlite_fill_seconds"] = round(
            asyncio.run(fill(url, args.sessions, args.subject_sessions)), 1
        )
        results["sqlite"] = asyncio.run(measure(url, args.subject_sessions))
        print("sqlite", results["sqlite"])
    if args.pg:
        with pg_databases(args.pg, 1) as (pg,):
            asyncio.run(fill(pg, args.sessions, args.subject_sessions))
            results["postgresql"] = asyncio.run(measure(pg, args.subject_sessions))
            print("postgresql", results["postgresql"])
    write_results("erase", results)


if __name__ == "__main__":
    main()
