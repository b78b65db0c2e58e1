"""A session save as one statement, for a dialect where each statement is a network round trip.

``session_save`` does what :func:`~.sessions.op_append_messages` does in several statements (the lease's
fence, the conditional head update, the inserts of the messages) in one, which commits on its own when it
runs outside ``atomic()``: PostgreSQL's save costs one round trip instead of BEGIN, three statements and
COMMIT. Only when it changes nothing are more statements run, to say why (``LeaseLost``, ``ConflictError``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from ..base import NewMessage, SessionLease, SessionRecord
from . import Tx, utcnow
from .sessions import check_fence, head_update_args, refuse_append, session_from_row


async def op_save_in_one_statement(
    tx: Tx,
    key: str,
    expected_head: int,
    messages: Sequence[NewMessage],
    metadata: bytes | None,
    status: str | None,
    lease: SessionLease | None,
    expected_created_at: dt.datetime | None,
    expected_version: int | None,
    open_calls: int | None,
    calls_owner: str | None,
    write_id: str | None,
    expected_rewinds: int | None,
) -> SessionRecord:
    now = tx.ts_in(utcnow())
    roles: list[str | None] = []
    payloads: list[str | None] = []
    usages: list[str | None] = []
    for seq, m in enumerate(messages, expected_head):
        roles.append(m.role)
        payloads.append(tx.sealed_in(m.payload, "message", key, seq))
        usages.append(None if m.usage is None else tx.json_in(m.usage))
    row = await tx.fetchone(
        "session_save",
        *head_update_args(
            tx,
            len(messages),
            metadata,
            now,
            key,
            expected_head,
            status,
            expected_created_at,
            expected_version,
            open_calls,
            calls_owner,
            write_id,
            expected_rewinds,
        ),
        None if lease is None else lease.token,
        None if lease is None else lease.owner,
        tx.array_in(roles),
        tx.array_in(payloads),
        tx.array_in(usages),
    )
    if row is None:
        # Nothing was written: a stale lease is named first, as the fence before an append would.
        await check_fence(tx, key, lease)
        await refuse_append(tx, key, expected_head, expected_created_at, expected_version, expected_rewinds)
    return session_from_row(tx, row)
