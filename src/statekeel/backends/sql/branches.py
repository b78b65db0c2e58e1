"""Forks, rewinds and usage of sessions: the operations every SQL dialect shares (see docs/branches.md)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from ...errors import ConflictError, InvalidArgument, NotFound
from ...validation import check_aware, check_int, check_key, check_str
from ..base import Branch, RewindRecord, SessionLease, SessionRecord
from . import SqlBackend, Tx, utcnow
from .lineage import chain, chain_rows, resealed, view_rows
from .sessions import check_fence, session_from_row

_EMPTY_OBJECT = b"{}"


async def op_fork_session(
    tx: Tx, key: str, at_seq: int, new_key: str, metadata: bytes | None, calls_owner: str | None
) -> SessionRecord:
    # The parent's row is locked until the commit: it cannot be deleted (nor rewound) under the fork.
    parent = await tx.fetchone("session_get_for_update", key)
    if parent is None:
        raise NotFound(f"session {key!r} does not exist: nothing to fork", key=key)
    if not 0 <= at_seq <= parent["head_seq"]:
        raise InvalidArgument(
            f"at_seq {at_seq} is outside session {key!r}'s history (0..{parent['head_seq']}): "
            "a fork starts at a seq of its parent",
            key=key,
            at_seq=at_seq,
        )
    now = tx.ts_in(utcnow())
    # Without metadata of its own the fork starts with its parent's, as stored.
    meta = parent["metadata"] if metadata is None else tx.json_in(metadata)
    row = await tx.fetchone("session_insert_fork", new_key, meta, key, at_seq, now, calls_owner)
    if row is None:
        raise ConflictError(
            f"session {new_key!r} already exists: choose another key for the fork", key=new_key
        )
    await tx.execute("session_steps_inherit", new_key, key, at_seq)
    return session_from_row(tx, row)


async def op_message_usages(tx: Tx, key: str) -> list[tuple[int, dict[str, Any]]] | None:
    row = await tx.fetchone("session_get", key)
    if row is None:
        return None
    record = session_from_row(tx, row)
    parts = [(key, 0, record.head_seq)]
    if (
        record.parent_key is not None
        and record.parent_seq is not None
        and record.last_consolidated < record.parent_seq
    ):
        parts += await chain(tx, record.parent_key, record.parent_seq, record.last_consolidated)
    usages: list[tuple[int, dict[str, Any]]] = []
    for part_key, lo, hi in parts:
        rows = await tx.fetchall("usage_rows", part_key, lo, hi)
        usages += [(int(r["seq"]), tx.json_out(r["usage"])) for r in rows]
    # A fork's own part is stored from its fork point on and its ancestors' parts below it: one history.
    return sorted(usages, key=lambda u: u[0])


async def op_session_usage(tx: Tx, key: str) -> list[dict[str, Any]] | None:
    found = await op_message_usages(tx, key)
    return None if found is None else [u for _, u in found]


async def op_session_rewinds(tx: Tx, key: str) -> list[RewindRecord]:
    return [
        RewindRecord(
            key, r["compression_id"], r["first_seq"], r["upto_seq"], r["summary"], tx.ts_out(r["created_at"])
        )
        for r in await tx.fetchall("rewind_list", key)
    ]


async def op_session_branches(tx: Tx, key: str) -> list[Branch]:
    return [
        Branch(r["key"], r["parent_seq"], r["head_seq"], tx.ts_out(r["created_at"]))
        for r in await tx.fetchall("session_children", key)
    ]


async def op_rewind_session(
    tx: Tx,
    key: str,
    to_seq: int,
    reason: str,
    compression_id: str,
    expected_head: int,
    lease: SessionLease | None,
    expected_created_at: dt.datetime | None,
    calls_owner: str | None = None,
) -> tuple[RewindRecord, SessionRecord]:
    await check_fence(tx, key, lease)
    # Locked until the commit: no append, fork or delete of this session runs in between.
    current = await tx.fetchone("session_get_for_update", key)
    if current is None:
        raise NotFound(f"session {key!r} does not exist: nothing to rewind", key=key)
    if expected_created_at is not None and tx.ts_out(current["created_at"]) != expected_created_at:
        raise ConflictError(
            f"session {key!r} was deleted and created again since it was read; nothing was rewound", key=key
        )
    head = current["head_seq"]
    if head != expected_head:
        raise ConflictError(
            f"session {key!r} has head {head}, not the expected {expected_head}: another writer appended "
            "since it was read; nothing was rewound",
            key=key,
            expected=expected_head,
            current=head,
        )
    if not current["last_consolidated"] <= to_seq < head:
        raise InvalidArgument(
            f"to_seq {to_seq} must be at least last_consolidated {current['last_consolidated']} (what was "
            f"compressed cannot be rewound) and below the head {head} of session {key!r}",
            key=key,
            to_seq=to_seq,
        )
    parent_key, parent_seq = current["parent_key"], current["parent_seq"]
    own_lo = parent_seq if parent_key is not None else 0
    # Forks that read past to_seq get their own copy of that part first: their history does not change.
    for child in await tx.fetchall("session_children_for_update", key):
        hi = child["parent_seq"]
        if to_seq >= hi:
            continue
        # What the fork compressed is in its own archive already; the rest is copied.
        lo = max(to_seq, child["last_consolidated"])
        if lo < hi:
            rows = await view_rows(tx, key, parent_key, own_lo, lo, hi)
            await tx.executemany(
                "message_insert",
                [
                    (
                        child["key"],
                        r["seq"],
                        r["role"],
                        resealed(tx, r["payload"], src, child["key"], r["seq"]),
                        r["created_at"],
                        r["usage"],
                    )
                    for src, r in rows
                ],
            )
        # Its fork point moves to to_seq even when nothing was copied: its own forks read [to_seq, hi)
        # through it, from its archive, and never from this session's rewound part.
        await tx.execute("session_cut_fork", child["key"], to_seq, key)
    now_dt = utcnow()
    # Rewind records list in creation order (the k-th is the rewind that made the count k: how a
    # reference taken under a count is resolved), even when this clock is behind the last rewinder's.
    earlier = await tx.fetchall("rewind_list", key)
    if earlier:
        last = tx.ts_out(earlier[-1]["created_at"])
        if now_dt <= last:
            now_dt = last + dt.timedelta(microseconds=1)
    now = tx.ts_in(now_dt)
    await tx.execute("rewind_insert", key, compression_id, to_seq, head, reason, now)
    if to_seq < own_lo:
        # Rewinding into what a fork inherited: the rewind record keeps its own copy of that part.
        inherited = await chain_rows(tx, parent_key, own_lo, to_seq, own_lo)
        await tx.executemany(
            "rewound_insert",
            [
                (
                    key,
                    compression_id,
                    r["seq"],
                    r["role"],
                    resealed(tx, r["payload"], src, key, r["seq"]),
                    r["created_at"],
                    r["usage"],
                )
                for src, r in inherited
            ],
        )
    await tx.execute("rewound_copy", compression_id, key, max(to_seq, own_lo), head)
    await tx.execute("message_delete_range", key, max(to_seq, own_lo), head)
    row = await tx.fetchone("session_rewind", to_seq, now, key, head, calls_owner)
    assert row is not None  # the row is locked by this transaction
    return RewindRecord(key, compression_id, to_seq, head, reason, now_dt), session_from_row(tx, row)


class SqlBranches(SqlBackend):
    """Forks, rewinds and usage of the session contract over the operations above."""

    async def fork_session(
        self,
        key: str,
        at_seq: int,
        new_key: str,
        *,
        metadata: bytes | None = None,
        calls_owner: str | None = None,
    ) -> SessionRecord:
        check_key(key, "session key")
        check_key(new_key, "new_key")
        check_int(at_seq, "at_seq")
        if calls_owner is not None:
            check_str(calls_owner, "calls_owner")
        return await self._write(op_fork_session, key, at_seq, new_key, metadata, calls_owner)

    async def rewind_session(
        self,
        key: str,
        to_seq: int,
        *,
        reason: str,
        compression_id: str,
        expected_head: int,
        lease: SessionLease | None = None,
        expected_created_at: dt.datetime | None = None,
        calls_owner: str | None = None,
    ) -> tuple[RewindRecord, SessionRecord]:
        check_key(key, "session key")
        check_int(to_seq, "to_seq")
        check_int(expected_head, "expected_head")
        check_str(reason, "reason")
        check_str(compression_id, "compression_id")
        if expected_created_at is not None:
            check_aware(expected_created_at, "expected_created_at")
        if calls_owner is not None:
            check_str(calls_owner, "calls_owner")
        return await self._write(
            op_rewind_session,
            key,
            to_seq,
            reason,
            compression_id,
            expected_head,
            lease,
            expected_created_at,
            calls_owner,
        )

    async def session_usage(self, key: str) -> list[dict[str, Any]] | None:
        return await self._read(op_session_usage, key)

    async def message_usages(self, key: str) -> list[tuple[int, dict[str, Any]]] | None:
        return await self._read(op_message_usages, key)

    async def session_rewinds(self, key: str) -> list[RewindRecord]:
        return await self._read(op_session_rewinds, key)

    async def session_branches(self, key: str) -> list[Branch]:
        return await self._read(op_session_branches, key)


__all__ = ["SqlBranches"]
