"""Erasure: deleting everything about one subject, shared by the SQL dialects.

Candidates are read on a snapshot, outside any write transaction (finding a subject's sessions by their
metadata reads the whole table, which must not hold the write lock); each batch then deletes its
candidates in one short transaction, every statement re-checking what made its row the subject's. A dry
run takes the same path and only counts. Rows that depend on a session (episodes, file ledger records,
spans and checkpoints named after it, vectors) are deleted in the same transaction as the session: a
process killed between two batches leaves whole sessions, so running the erasure again finds and finishes
them.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from typing import Any

import orjson

from ..base import ErasureBackend, ErasureBatch
from . import SqlBackend, Tx
from .vectors import delete_source_vectors

SESSION_KINDS = (
    "sessions",
    "messages",
    "archived_messages",
    "rewound_messages",
    "compressions",
    "tool_calls",
    "file_changes",
    "traces",
    "checkpoints",
)


def _add(counts: dict[str, int], kind: str, n: int) -> None:
    counts[kind] = counts.get(kind, 0) + n


async def op_erasure_sessions(tx: Tx, subject: str, after: str | None, limit: int) -> list[str]:
    rows = await tx.fetchall("erase_sessions_page", subject, after or "", limit)
    return [str(r["key"]) for r in rows]


async def op_erase_sessions(
    tx: Tx, subject: str, keys: Sequence[str], now: dt.datetime, dry_run: bool
) -> ErasureBatch:
    began = time.perf_counter()
    counts: dict[str, int] = {}
    erased: list[str] = []
    for key in keys:
        check = await tx.fetchone(
            "erase_session_check" if dry_run else "erase_session_check_lock", key, subject
        )
        if check is not None and not check["mine"]:
            continue  # the session no longer names the subject: it and what belongs to it stay
        if check is not None and not dry_run:
            # Its forks go first, deepest first, in this transaction: none is left pointing at nothing,
            # and a fork made while the erasure runs either is erased here or finds its parent gone. (A
            # dry run counts each fork in its own turn: the candidates include every fork.)
            for fork in await _forks(tx, key):
                await _erase_session(tx, fork, subject, now, dry_run, counts, erased)
        await _erase_session(tx, key, subject, now, dry_run, counts, erased)
    return ErasureBatch(counts, None, time.perf_counter() - began, tuple(erased))


async def _forks(tx: Tx, key: str) -> list[str]:
    """Every fork of ``key`` (and forks of forks), deepest first, locked where the dialect locks rows.
    Listed again until the list no longer changes: a fork committed while the first listing waited on a
    lock is seen by the next one, and once they are all locked no further fork of them can be made."""
    listed: list[str] = []
    while True:
        again = [str(r["key"]) for r in await tx.fetchall("erase_session_forks", key)]
        if again == listed:
            return listed
        listed = again


async def _erase_session(
    tx: Tx,
    key: str,
    subject: str,
    now: dt.datetime,
    dry_run: bool,
    counts: dict[str, int],
    erased: list[str],
) -> None:
    """Erase (or count) one session of the subject with what belongs to it."""
    row = await tx.fetchone("erase_session_counts", key)
    assert row is not None  # an aggregate always returns one row
    found = {kind: int(row[kind]) for kind in SESSION_KINDS}
    episodes = [r["id"] for r in await tx.fetchall("erase_session_episodes", key)]
    vectors = 0
    for source in (*episodes, key):
        vectors += await delete_source_vectors(tx, source, dry_run)
    held = await tx.fetchone("erase_session_lease_held", key, tx.ts_in(now))
    if not dry_run:
        await tx.execute("erase_session_episodes_delete", key)
        await tx.execute("erase_session_files", key)
        await tx.execute("erase_session_traces", key)
        await tx.execute("erase_session_checkpoint_writes", key)
        await tx.execute("erase_session_checkpoint_blobs", key)
        await tx.execute("erase_session_checkpoints", key)
        await tx.execute("erase_session_lease", key, tx.ts_in(now))
        # Checked above (and locked, on PostgreSQL and MariaDB): the session is the subject's, or a
        # fork of one of the subject's, or there is none. The delete checks it again in its WHERE.
        found["sessions"] = await tx.execute("erase_session_delete", key, subject)
        if found["sessions"]:
            erased.append(key)
    for kind, n in found.items():
        _add(counts, kind, n)
    _add(counts, "episodes", len(episodes))
    _add(counts, "vectors", vectors)
    _add(counts, "leases_held", int(held["n"]) if held is not None else 0)


async def op_erasure_spans(
    tx: Tx, subject: str, keys: Sequence[str], after: tuple[str, str] | None, limit: int
) -> list[tuple[str, str]]:
    trace, span = after if after is not None else ("", "")
    rows = await tx.fetchall("erase_traces_page", subject, trace, span, _json_list(keys), limit)
    return [(str(r["trace_id"]), str(r["span_id"])) for r in rows]


def _json_list(keys: Sequence[str]) -> str:
    return orjson.dumps(list(keys)).decode("utf-8")


async def op_erase_spans(
    tx: Tx, subject: str, keys: Sequence[str], spans: Sequence[tuple[str, str]], dry_run: bool
) -> ErasureBatch:
    began = time.perf_counter()
    if dry_run:
        return ErasureBatch({"traces": len(spans)}, None, time.perf_counter() - began)
    listed = _json_list(keys)
    n = 0
    for trace_id, span_id in spans:
        n += await tx.execute("erase_trace_delete", trace_id, span_id, subject, listed)
    return ErasureBatch({"traces": n}, None, time.perf_counter() - began)


async def op_erase_memories(
    tx: Tx, subject: str, after: str | None, limit: int, now: dt.datetime, dry_run: bool
) -> ErasureBatch:
    began = time.perf_counter()
    rows = await tx.fetchall("erase_memories_page", subject, after or "", limit)
    counts: dict[str, int] = {}
    for row in rows:
        memory_id = row["id"]
        found = await tx.fetchone("erase_memory_counts", memory_id, subject)
        assert found is not None
        for kind in ("memory_events", "memory_accesses", "contradictions", "relations"):
            _add(counts, kind, int(found[kind]))
        _add(counts, "vectors", await delete_source_vectors(tx, memory_id, dry_run))
        deleted = 1
        if not dry_run:
            await tx.execute("erase_memory_accesses", memory_id)
            await tx.execute("erase_memory_close_contradictions", memory_id, tx.ts_in(now))
            await tx.execute("erase_memory_relations", memory_id)
            deleted = await tx.execute("erase_memory_delete", memory_id, subject)
        _add(counts, "memories", deleted)
    last = str(rows[-1]["id"]) if len(rows) == limit else None
    return ErasureBatch(counts, last, time.perf_counter() - began)


async def op_erase_relations(
    tx: Tx, subject: str, after: str | None, limit: int, dry_run: bool
) -> ErasureBatch:
    began = time.perf_counter()
    rows = await tx.fetchall("erase_relations_page", subject, after or "", limit)
    n = len(rows)
    if not dry_run:
        n = 0
        for row in rows:
            n += await tx.execute("erase_relation_delete", row["id"], subject)
    last = str(rows[-1]["id"]) if len(rows) == limit else None
    return ErasureBatch({"relations": n}, last, time.perf_counter() - began)


async def op_erase_episodes(
    tx: Tx, subject: str, keys: Sequence[str], after: str | None, limit: int, dry_run: bool
) -> ErasureBatch:
    began = time.perf_counter()
    rows = await tx.fetchall("erase_episodes_page", subject, after or "", limit, _json_list(keys))
    counts = {"episodes": 0, "vectors": 0}
    for row in rows:
        counts["vectors"] += await delete_source_vectors(tx, row["id"], dry_run)
        counts["episodes"] += 1 if dry_run else await tx.execute("erase_episode_delete", row["id"], subject)
    last = str(rows[-1]["id"]) if len(rows) == limit else None
    return ErasureBatch(counts, last, time.perf_counter() - began)


class SqlErasure(SqlBackend, ErasureBackend):
    """The erasure contract over the shared operations above. Deleting batches go through
    ``_write_bulk`` (on SQLite: the writer thread); dry runs and candidate listings are reads."""

    async def _batch(self, op: Any, dry_run: bool, *args: Any) -> ErasureBatch:
        batch: ErasureBatch = await (self._read(op, *args) if dry_run else self._write_bulk(op, *args))
        return batch

    async def erasure_sessions(self, subject: str, *, after: str | None, limit: int) -> list[str]:
        return await self._read(op_erasure_sessions, subject, after, limit)

    async def erase_sessions(
        self, subject: str, keys: Sequence[str], *, now: dt.datetime, dry_run: bool
    ) -> ErasureBatch:
        return await self._batch(op_erase_sessions, dry_run, subject, list(keys), now, dry_run)

    async def erasure_spans(
        self, subject: str, keys: Sequence[str], *, after: tuple[str, str] | None, limit: int
    ) -> list[tuple[str, str]]:
        return await self._read(op_erasure_spans, subject, list(keys), after, limit)

    async def erase_spans(
        self, subject: str, keys: Sequence[str], spans: Sequence[tuple[str, str]], *, dry_run: bool
    ) -> ErasureBatch:
        return await self._batch(op_erase_spans, dry_run, subject, list(keys), list(spans), dry_run)

    async def erase_memories(
        self, subject: str, *, after: str | None, limit: int, now: dt.datetime, dry_run: bool
    ) -> ErasureBatch:
        return await self._batch(op_erase_memories, dry_run, subject, after, limit, now, dry_run)

    async def erase_relations(
        self, subject: str, *, after: str | None, limit: int, dry_run: bool
    ) -> ErasureBatch:
        return await self._batch(op_erase_relations, dry_run, subject, after, limit, dry_run)

    async def erase_episodes(
        self, subject: str, keys: Sequence[str], *, after: str | None, limit: int, dry_run: bool
    ) -> ErasureBatch:
        return await self._batch(op_erase_episodes, dry_run, subject, list(keys), after, limit, dry_run)
