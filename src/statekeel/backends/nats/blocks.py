"""``atomic()`` on a NATS store: the writes of one session in a block become one event, published at its end.

JetStream has no transaction spanning several subjects, but a session is one subject and one event is
stored whole or not at all. So a block groups the writes of **one session**: each write is decided on the
block's own copy of the session (which the block's reads see too), the events are merged into one, and
at the end of the outermost block that event is published conditional on the session's state when the
block first read it (``Nats-Expected-Last-Subject-Sequence``). If another writer changed the session in
between, nothing of the block is stored and it raises ``ConflictError``; if the block raises, nothing is
published. That is what ``sessions.run_tool`` and ``resolve_tool`` need (a save and its step record
together). A write to a second session inside the block is refused (``Unsupported``) before anything is
written; writes of other kinds (audit entries, spans, heartbeats) commit on their own, at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

import nats.js.errors

from ...errors import ConflictError, StorageCorrupt, Unsupported
from .client import WRONG_LAST_SEQUENCE
from .sessions import NatsSessions, SessionState

__all__ = ["Block", "commit", "copy_state"]


def copy_state(state: SessionState) -> SessionState:
    """A copy the block can fold its writes into without touching the process's cached state (folding
    only appends to the lists and replaces the row, so their items can be shared)."""
    return SessionState(
        seq=state.seq,
        read_seq=state.read_seq,
        writes=dict(state.writes),
        row=state.row,
        fence=state.fence,
        messages=list(state.messages),
        compressions=list(state.compressions),
        steps=dict(state.steps),
    )


@dataclass
class Block:
    """One outermost ``atomic()`` block of a NATS store: the session it writes, the state the block
    started from (``base``), the block's own copy (``work``), the merged event, and the callbacks of
    ``on_block_end``."""

    url: str
    key: str | None = None
    base: SessionState | None = None
    work: SessionState | None = None
    event: dict[str, Any] = field(default_factory=dict)
    callbacks: list[Callable[[bool], None]] = field(default_factory=list)
    ended: bool = False

    def pin(self, key: str, base: SessionState) -> SessionState:
        """Make ``key`` the block's session, read at ``base``; its copy is what the block reads."""
        self.key, self.base, self.work = key, base, copy_state(base)
        return self.work

    def check_key(self, key: str) -> None:
        if self.key != key:
            raise Unsupported(
                f"an atomic() block on a NATS store ({self.url}) groups the writes of one session: it "
                f"wrote {self.key!r}, and cannot write {key!r} too; nothing was written for it (write the "
                "other session outside the block, or keep sessions in a SQL store)",
                kind="transactions",
                url=self.url,
                hint="",
            )

    def add(self, event: dict[str, Any], where: str) -> None:
        """Merge ``event`` (decided on ``work``) into the block's event, and fold it into ``work``."""
        assert self.work is not None
        if event.get("reset"):
            self.event = {}  # a delete: what the block wrote before it goes with the session
        merged = self.event
        for name, value in event.items():
            if name == "msgs":
                merged.setdefault("msgs", []).extend(value)
            elif name == "steps":
                merged.setdefault("steps", {}).update(value)
            elif name == "compress" and "compress" in merged:
                raise Unsupported(
                    f"an atomic() block on a NATS store ({self.url}) compresses a session once; nothing "
                    "was written for the second compression",
                    kind="transactions",
                    url=self.url,
                    hint="",
                )
            else:
                merged[name] = value
        work = self.work
        work.apply(work.read_seq + 1, {**event, "after": work.seq, "wid": ""}, where)

    def end(self, committed: bool) -> None:
        """Run the callbacks: in order after a commit, in reverse order (last first) otherwise."""
        self.ended = True
        for callback in self.callbacks if committed else reversed(self.callbacks):
            callback(committed)


async def commit(sessions: NatsSessions, block: Block) -> None:
    """Publish the merged event of an ``atomic()`` block, conditional on the state it started from:
    ``ConflictError`` (nothing stored) when another writer changed the session meanwhile."""
    if block.key is None or not block.event:
        return
    key, base = block.key, block.base
    assert base is not None
    wid = f"s-{uuid.uuid4().hex}"
    event = {**block.event, "after": base.seq, "wid": wid}
    headers = {"Nats-Expected-Last-Subject-Sequence": str(base.read_seq), "Nats-Msg-Id": wid}
    stream = sessions.sessions_stream
    conflict = ConflictError(
        f"session {key!r} changed in the store while the atomic() block that writes it ran; nothing "
        "of the block was written: load the session again and retry",
        key=key,
    )
    try:
        seq, _ = await sessions.conn.publish(
            sessions.session_subject(key),
            orjson.dumps(event),
            stream=stream,
            headers=headers,
            what=f"session {key!r}",
        )
    except nats.js.errors.APIError as exc:
        if exc.err_code == WRONG_LAST_SEQUENCE:
            raise conflict from None
        raise StorageCorrupt(f"the NATS stream {stream} refused: {exc.description}") from exc
    state = await sessions.read_state(key)
    if state.writes.get(wid) != seq:
        raise conflict  # stored after another event (a condition the server lost): read past
    await sessions.written(key, state, event, seq)
