"""Sealed segments: a session's older messages packed into one row per run, so a load reads a few rows.

A run is ``SEGMENT`` messages starting at a multiple of ``SEGMENT``. Once every message of a run is older
than the live tail (``LIVE_TAIL`` messages behind the head), the append that moved it there also writes a
segment: the JSON array of the run's stored payloads, built by the database from the rows in the same
transaction, so a segment exists only for a run whose rows were all there and commits or rolls back with
the append. The rows stay the truth: every reader but a load reads them, and the schema drops the segment
covering a row that is deleted or changed (compression, rewind, key rotation, erasure, purge), so a
segment never disagrees with its rows. A run left unsealed that way is sealed again at a later crossing
(at most ``CATCH_UP`` runs per save, which bounds what one save writes).

Only a dialect whose :class:`~statekeel.backends.sql.Tx` sets ``segments`` keeps them (SQLite, where a
load's cost is per row stepped and decoded).
"""

from __future__ import annotations

from typing import Any

import orjson

from ...errors import StorageCorrupt
from ..base import SessionRecord
from . import Row, Tx

SEGMENT = 256  # messages per segment: the migration's CHECK and triggers say the same
LIVE_TAIL = 64  # the newest messages (some 16 turns), never sealed: the ones a rewind most likely drops
CATCH_UP = 8  # runs one save seals at most
# The named queries only a dialect that keeps segments defines.
QUERIES = frozenset({"segment_seal", "segment_firsts", "segment_range"})


def decode_payloads(tx: Tx, arr: Any, key: str, lo: int) -> list[dict[str, Any]]:
    """The messages of one stored ``[payload, ...]`` array whose first element is message ``lo``."""
    cipher = tx.codec.cipher
    if cipher is None:
        payloads: list[dict[str, Any]] = tx.json_out(arr)
        return payloads
    # Each element is sealed under its own identity: open them one by one, in seq order, and decode the
    # plaintexts as one array (one decode, as without a key).
    sealed = orjson.loads(arr)
    plain = [cipher.open_raw(value, "message", (key, seq)) for seq, value in enumerate(sealed, lo)]
    decoded: list[dict[str, Any]] = tx.codec.decode(b"[" + b",".join(plain) + b"]")
    return decoded


def payload_array(tx: Tx, row: Row, key: str, lo: int, hi: int) -> list[dict[str, Any]]:
    """Decode one aggregate of rows (``arr``, ``n``, ``lo``, ``hi``), after checking it holds exactly the
    dense seqs lo..hi-1."""
    n = row["n"]
    if n != hi - lo or (n and (row["lo"] != lo or row["hi"] != hi - 1)):
        raise StorageCorrupt(
            f"session {key!r}: messages {lo}..{hi - 1} should all be stored, found {n} "
            f"(seq {row['lo']}..{row['hi']})",
            key=key,
        )
    return decode_payloads(tx, row["arr"], key, lo) if n else []


def sealable_upto(head: int) -> int:
    """The end of the last run wholly older than the live tail of a session at ``head``."""
    return max(head - LIVE_TAIL, 0) // SEGMENT * SEGMENT


async def seal(tx: Tx, record: SessionRecord, before_head: int) -> None:
    """After an append from ``before_head`` to ``record.head_seq``: seal the runs it moved out of the live
    tail, and older runs found unsealed, newest first, at most ``CATCH_UP``."""
    upto = sealable_upto(record.head_seq)
    if upto <= sealable_upto(before_head):
        return  # no run crossed: the common save pays this comparison only
    # A fork's own rows start at parent_seq; compressed rows are in the archive: neither is sealed here.
    floor = max(record.last_consolidated, record.parent_seq or 0)
    floor = -(-floor // SEGMENT) * SEGMENT
    if floor >= upto:
        return
    have = {r["first_seq"] for r in await tx.fetchall("segment_firsts", record.key, floor, upto)}
    missing = [first for first in range(upto - SEGMENT, floor - 1, -SEGMENT) if first not in have]
    for first in missing[:CATCH_UP]:
        await tx.execute("segment_seal", record.key, first)


def _segment(tx: Tx, row: Row, key: str) -> list[dict[str, Any]]:
    first, upto = row["first_seq"], row["upto_seq"]
    payloads = decode_payloads(tx, row["payloads"], key, first)
    if len(payloads) != upto - first:
        raise StorageCorrupt(
            f"session {key!r}: the sealed segment of messages {first}..{upto - 1} holds {len(payloads)}",
            key=key,
        )
    return payloads


async def live_payloads(tx: Tx, key: str, lo: int, hi: int, *, open_end: bool) -> list[dict[str, Any]]:
    """Live messages [lo, hi) of ``key``'s own rows: sealed segments where there are, rows around them.

    With ``open_end`` the last part is every row from its start, so a row past ``hi`` is found as damage."""
    out: list[dict[str, Any]] = []
    pos = lo
    if tx.segments and hi - lo >= SEGMENT:
        for row in await tx.fetchall("segment_range", key, lo, hi):
            first = row["first_seq"]
            if first > pos:
                part = await tx.fetchone("message_payload_range", key, pos, first)
                assert part is not None  # an aggregate always returns a row
                out += payload_array(tx, part, key, pos, first)
            out += _segment(tx, row, key)
            pos = row["upto_seq"]
    if open_end:
        rest = await tx.fetchone("message_payload_array", key, pos)
    else:
        rest = await tx.fetchone("message_payload_range", key, pos, hi)
    assert rest is not None
    out += payload_array(tx, rest, key, pos, hi)
    return out
