"""Key rotation of the encrypted fields: the operation every SQL dialect shares (see
statekeel.codec.encryption).

Each batch reads rows of one table in key order, re-seals under the current key the fields that are under
another one (or in plaintext, in ``encrypt_existing`` mode) and writes them back in the same transaction,
guarded where the row has a writer of its own (a step's result, a memory's version). Rows already under
the current key are left alone, so a rotation interrupted anywhere is finished by running it again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from ...codec.encryption import ROTATION_TABLES, Cipher, Identity
from ...errors import InvalidArgument
from ..base import EncryptionBackend, ResealPage
from . import Row, SqlBackend, Tx

# The record's kind and identity, and whose data key seals it with a key ring (a memory's scope; a
# message's session is its identity's first part).
Sealing = tuple[str, Identity, str | None]


def _message(row: Row, column: str) -> Sealing:
    return "message", (row["session_key"], row["seq"]), None


def _step(row: Row, column: str) -> Sealing:
    return "step", (row["task_id"], row["step_key"]), None


def _approval(row: Row, column: str) -> Sealing:
    return "approval", (row["id"],), None


def _memory(row: Row, column: str) -> Sealing:
    return "memory", (row["id"], column), row["scope"]


def _memory_event(row: Row, column: str) -> Sealing:
    # An event's state carries its memory's sealed content and data as they were (same identity).
    return "memory", (row["memory_id"], column), row["scope"]


@dataclass(frozen=True, slots=True)
class _Table:
    key: tuple[str, ...]  # the cursor: the table's primary key
    start: tuple[Any, ...]  # before every row (ids are never empty, seqs and versions never negative)
    columns: tuple[str, ...]  # the sealed columns (memory_events: the fields inside ``state``)
    sealing: Callable[[Row, str], Sealing]
    guard: tuple[str, ...] = ()  # columns compared again by the UPDATE, after the key
    nested: bool = False


_TABLES = {
    "messages": _Table(("session_key", "seq"), ("", -1), ("payload",), _message),
    "message_archive": _Table(("session_key", "seq"), ("", -1), ("payload",), _message),
    "rewound_messages": _Table(
        ("session_key", "compression_id", "seq"), ("", "", -1), ("payload",), _message
    ),
    "task_steps": _Table(("task_id", "step_key"), ("", ""), ("result",), _step, guard=("result",)),
    "approvals": _Table(("id",), ("",), ("args",), _approval),
    "memories": _Table(("id",), ("",), ("content", "data"), _memory, guard=("version",)),
    "memory_events": _Table(
        ("memory_id", "version"), ("", 0), ("content", "data"), _memory_event, nested=True
    ),
}
assert tuple(_TABLES) == ROTATION_TABLES


def _reseal(cipher: Cipher, parsed: Any, sealing: Sealing) -> Any | None:
    """``parsed`` re-sealed under the current key (parsed JSON), or None if it already is (or is under a
    data key of the key ring, which the rotation re-wraps instead)."""
    kind, identity, subject = sealing
    if cipher.settled(cipher.stored_key_id(parsed, kind, identity), kind, identity, subject):
        return None
    return orjson.loads(cipher.seal(cipher.open_raw(parsed, kind, identity), kind, identity, subject))


def _resealed_row(tx: Tx, cipher: Cipher, spec: _Table, row: Row) -> list[Any] | None:
    """The new values of the row's sealed columns, or None if every one is under the current key."""
    if spec.nested:
        state = orjson.loads(row["state"])
        changed = False
        for column in spec.columns:
            if state.get(column) is None:
                continue
            new = _reseal(cipher, state[column], spec.sealing(row, column))
            if new is not None:
                state[column], changed = new, True
        return [tx.json_in(orjson.dumps(state))] if changed else None
    values: list[Any] = []
    changed = False
    for column in spec.columns:
        stored = row[column]
        if stored is not None:
            new = _reseal(cipher, orjson.loads(stored), spec.sealing(row, column))
            if new is not None:
                stored, changed = tx.json_in(orjson.dumps(new)), True
        values.append(stored)
    return values if changed else None


async def op_reseal_rows(tx: Tx, table: str, after: tuple[Any, ...] | None, limit: int) -> ResealPage:
    cipher = tx.codec.cipher
    if cipher is None:
        raise InvalidArgument("key rotation needs a store opened with an encryption_key")
    spec = _TABLES[table]
    rows = await tx.fetchall(f"reseal_scan_{table}", *(spec.start if after is None else after), limit)
    rewritten = 0
    for row in rows:
        values = _resealed_row(tx, cipher, spec, row)
        if values is None:
            continue
        keys = [row[name] for name in spec.key]
        guards = [row[name] for name in spec.guard]
        rewritten += await tx.execute(f"reseal_update_{table}", *values, *keys, *guards)
    last = tuple(rows[-1][name] for name in spec.key) if len(rows) == limit else None
    return ResealPage(scanned=len(rows), rewritten=rewritten, after=last)


class SqlEncryption(SqlBackend, EncryptionBackend):
    """Key rotation over the shared operation above."""

    async def reseal_rows(self, table: str, *, after: tuple[Any, ...] | None, limit: int) -> ResealPage:
        if table not in _TABLES:
            raise InvalidArgument(f"no encrypted table {table!r}; one of {', '.join(ROTATION_TABLES)}")
        return await self._write_bulk(op_reseal_rows, table, None if after is None else tuple(after), limit)
