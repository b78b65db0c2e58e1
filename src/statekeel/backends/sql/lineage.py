"""Branches in the shared SQL: how a fork's history is read from its ancestors (a fork's row points at
its parent and the seq it forked at; its own messages are stored under its own key from there on), and
how a parent that goes or is rewound first gives its forks their own copy of what they read from it.
See docs/branches.md."""

from __future__ import annotations

from typing import Any

import orjson

from ...errors import StorageCorrupt
from . import Row, Tx


async def chain(
    tx: Tx, parent_key: str, parent_seq: int, start: int, *, live: list[bool] | None = None
) -> list[tuple[str, int, int]]:
    """The ancestors' parts ``(key, lo, hi)`` of a fork's history from ``start`` on, oldest first. With
    ``live``, one flag per part is appended to it: whether none of that part is archived."""
    parts = []
    for r in await tx.fetchall("session_chain", parent_key, parent_seq):
        lo, hi = max(r["lo"], start), r["hi"]
        if lo < hi:
            parts.append((r["key"], lo, hi))
            if live is not None:
                live.append(lo >= r["last_consolidated"])
    if not parts or parts[0][1] != max(start, 0) or sum(hi - lo for _, lo, hi in parts) != parent_seq - start:
        raise StorageCorrupt(
            f"the ancestors of a fork of session {parent_key!r} at {parent_seq} do not cover seqs "
            f"{start}..{parent_seq - 1}: {parts}",
            key=parent_key,
        )
    return parts


async def chain_rows(tx: Tx, parent_key: str, parent_seq: int, lo: int, hi: int) -> list[tuple[str, Row]]:
    """The stored rows of a fork's inherited seqs ``[lo, hi)`` (``hi <= parent_seq``), with the key each
    is stored (and sealed) under."""
    rows: list[tuple[str, Row]] = []
    for part_key, a, b in await chain(tx, parent_key, parent_seq, lo):
        b = min(b, hi)
        if a < b:
            rows += [(part_key, r) for r in await tx.fetchall("view_rows", part_key, a, b)]
    if [r["seq"] for _, r in rows] != list(range(lo, hi)):
        raise StorageCorrupt(
            f"the inherited messages {lo}..{hi - 1} of a fork of {parent_key!r} are not all stored",
            key=parent_key,
        )
    return rows


def resealed(tx: Tx, payload: Any, src: str, dst: str, seq: int) -> Any:
    """A stored payload of ``src`` at ``seq`` as ``dst``'s (sealed under its identity when encrypted)."""
    cipher = tx.codec.cipher
    if cipher is None or src == dst:
        return payload
    raw = payload.encode("utf-8") if isinstance(payload, str) else bytes(payload)
    return tx.sealed_in(cipher.open_raw(orjson.loads(raw), "message", (src, seq)), "message", dst, seq)


async def detach_forks(tx: Tx, key: str) -> int:
    """Before ``key`` is deleted: copy into each of its forks the part of ``key``'s history it reads
    (the seqs its own archive does not hold yet), and point it at ``key``'s own parent. Returns how many
    forks were detached. Runs in the delete's transaction, with ``key``'s row locked by the caller."""
    children = await tx.fetchall("session_children_for_update", key)
    if not children:
        return 0
    row = await tx.fetchone("session_get", key)
    assert row is not None
    grand_key, grand_seq = row["parent_key"], row["parent_seq"]
    own_lo = grand_seq or 0
    for child in children:
        lo, hi = max(own_lo, child["last_consolidated"]), child["parent_seq"]
        if lo < hi:
            rows = await tx.fetchall("view_rows", key, lo, hi)
            if [r["seq"] for r in rows] != list(range(lo, hi)):
                raise StorageCorrupt(f"session {key!r}: messages {lo}..{hi - 1} are not all stored", key=key)
            await tx.executemany(
                "message_insert",
                [
                    (
                        child["key"],
                        r["seq"],
                        r["role"],
                        resealed(tx, r["payload"], key, child["key"], r["seq"]),
                        r["created_at"],
                        r["usage"],
                    )
                    for r in rows
                ],
            )
        # It now reads [0, min(its fork point, key's own)) from key's parent, or nothing when key had none.
        new_seq = None if grand_key is None else min(hi, own_lo)
        await tx.execute("session_reparent", child["key"], grand_key, new_seq, key)
    return len(children)


async def view_rows(
    tx: Tx, key: str, parent_key: str | None, own_lo: int, lo: int, hi: int
) -> list[tuple[str, Row]]:
    """The stored rows of ``key``'s history ``[lo, hi)`` (inherited ones first), with the key each is
    stored under."""
    rows: list[tuple[str, Row]] = []
    if parent_key is not None and lo < own_lo:
        rows = await chain_rows(tx, parent_key, own_lo, lo, min(hi, own_lo))
    if max(lo, own_lo) < hi:
        rows += [(key, r) for r in await tx.fetchall("view_rows", key, max(lo, own_lo), hi)]
    if [r["seq"] for _, r in rows] != list(range(lo, hi)):
        raise StorageCorrupt(f"session {key!r}: messages {lo}..{hi - 1} are not all stored", key=key)
    return rows


__all__ = ["chain", "chain_rows", "detach_forks", "resealed", "view_rows"]
