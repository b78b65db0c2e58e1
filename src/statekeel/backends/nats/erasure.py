"""Erasure on NATS (``store.erase``): a subject's sessions, their lease entries and index rows, and spans.

A session is the subject's when its key is the subject or its metadata's ``"subject"`` is, checked again
on the state each delete is conditional on. Deleting it publishes the tombstone (as ``delete_session``
does) and then purges the subject up to the tombstone: nothing of the session is left on the stream.
Only a lease a live process holds stays (its entry and the tombstone with the fence, counted as
``leases_held``); an entry nobody holds is purged, conditional on the revision read. The index row is
purged up to the message read. Spans are the subject's when their attributes' ``subject`` is the subject,
their ``session_key`` / ``session.id`` one of the sessions, or their trace is named after one of them;
each is purged up to the message read, after checking that message again. A NATS store holds no
memories, relations, episodes, checkpoints or forks: there is nothing of the subject's among them.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from typing import Any

import nats.js.errors

from ...errors import StorageCorrupt
from ..base import ErasureBackend, ErasureBatch, Span
from .client import WRONG_LAST_SEQUENCE, encode_token, micros
from .sessions import SessionState
from .tool_calls import NatsToolCalls
from .traces import NatsTraces

__all__ = ["NatsErasure"]


def _add(counts: dict[str, int], kind: str, n: int) -> None:
    counts[kind] = counts.get(kind, 0) + n


class NatsErasure(NatsToolCalls, NatsTraces, ErasureBackend):
    """The erasure contract on the streams of a NATS store."""

    def _mine(self, row: dict[str, Any], subject: str) -> bool:
        if row["key"] == subject:
            return True
        metadata = self.codec.decode(row["metadata"])
        return isinstance(metadata, dict) and metadata.get("subject") == subject

    @staticmethod
    def _span_is(span: Span, subject: str, keys: set[str]) -> bool:
        a = span.attributes if isinstance(span.attributes, dict) else {}
        return (
            span.trace_id in keys
            or a.get("subject") == subject
            or a.get("session_key") in keys
            or a.get("session.id") in keys
        )

    async def erasure_sessions(self, subject: str, *, after: str | None, limit: int) -> list[str]:
        keys = sorted(r["key"] for r in await self._indexed() if self._mine(r, subject))
        return [k for k in keys if after is None or k > after][:limit]

    async def erase_sessions(
        self, subject: str, keys: Sequence[str], *, now: dt.datetime, dry_run: bool
    ) -> ErasureBatch:
        began = time.perf_counter()
        counts: dict[str, int] = {}
        erased: list[str] = []
        for key in keys:
            state = await self.read_state(key)
            row = state.row
            if row is not None and not self._mine(row, subject):
                continue  # the session no longer names the subject: it and what belongs to it stay
            revision, held = await self._lease_entry(key)
            live = held is not None and held["owner"] is not None and held["expires_at"] >= micros(now)
            found: dict[str, int] = {}
            if row is not None:
                found = {
                    "sessions": 1,
                    "messages": row["head_seq"] - row["last_consolidated"],
                    "archived_messages": sum(c[2] - c[1] for c in state.compressions),
                    "compressions": len(state.compressions),
                    "tool_calls": sum(1 for s in state.steps.values() if s is not None),
                }
            if not dry_run:
                if row is not None and not await self._erase_session(key, subject, keep_fence=live):
                    continue  # changed to another subject's since it was read: it stays
                if row is not None:
                    erased.append(key)
                if not live and held is not None:
                    live = not await self._purge_lease(key, revision)
                if not live:
                    await self._purge_subject(self.sessions_stream, self.session_subject(key))
                await self._purge_subject(f"{self.prefix}_index", f"{self.prefix}.i.{encode_token(key)}")
            for kind, n in found.items():
                _add(counts, kind, n)
            _add(counts, "leases_held", int(live))
        return ErasureBatch(counts, None, time.perf_counter() - began, tuple(erased))

    async def _erase_session(self, key: str, subject: str, *, keep_fence: bool) -> bool:
        """Delete the session if it is still the subject's (checked on the state the tombstone follows)."""

        def decide(s: SessionState) -> tuple[dict[str, Any] | None, Callable[[SessionState], bool]]:
            if s.row is None:
                return None, lambda n: True  # deleted meanwhile: what is left is purged below
            if not self._mine(s.row, subject):
                return None, lambda n: False
            return {"reset": True, "row": None, "fence": s.fence if keep_fence else 0}, lambda n: True

        return await self._change(key, decide, own=True)

    async def _purge_subject(self, stream: str, subject: str) -> None:
        """Purge ``subject`` up to its last message as read now: a message published since stays."""
        last = await self.conn.last(stream, subject)
        if last is not None and last.seq is not None:
            await self.conn.purge(stream, subject, before_seq=last.seq + 1)

    async def _purge_lease(self, key: str, revision: int) -> bool:
        """Purge the lease entry (a KV purge: a roll-up marker) if it is still at ``revision``; False
        when a process changed it since (it took the lease: the entry stays)."""
        try:
            await self.conn.publish(
                self._lease_subject(key),
                b"",
                stream=self._leases_stream,
                headers={
                    "KV-Operation": "PURGE",
                    "Nats-Rollup": "sub",
                    "Nats-Expected-Last-Subject-Sequence": str(revision),
                },
                what=f"erasing the lease of session {key!r}",
            )
        except nats.js.errors.APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                return False
            raise StorageCorrupt(f"the NATS stream {self._leases_stream} refused: {exc.description}") from exc
        return True

    async def erasure_spans(
        self, subject: str, keys: Sequence[str], *, after: tuple[str, str] | None, limit: int
    ) -> list[tuple[str, str]]:
        named = set(keys)
        found = sorted(
            (s.trace_id, s.span_id)
            for _, s in await self._all_spans(f"{self.prefix}.span.*.*")
            if self._span_is(s, subject, named)
        )
        return [ids for ids in found if after is None or ids > after][:limit]

    async def erase_spans(
        self, subject: str, keys: Sequence[str], spans: Sequence[tuple[str, str]], *, dry_run: bool
    ) -> ErasureBatch:
        began = time.perf_counter()
        if dry_run:
            return ErasureBatch({"traces": len(spans)}, None, time.perf_counter() - began)
        named, n = set(keys), 0
        for trace_id, span_id in spans:
            span_subject = self._span_subject(trace_id, span_id)
            last = await self.conn.last(self._traces_stream, span_subject)
            if last is None or last.seq is None or last.data is None:
                continue
            # Checked again on the message purged, up to it: a span recorded again since then stays.
            if self._span_is(self._span(last.seq, last.data), subject, named):
                await self.conn.purge(self._traces_stream, span_subject, before_seq=last.seq + 1)
                n += 1
        return ErasureBatch({"traces": n}, None, time.perf_counter() - began)

    # A NATS store holds no memories, graph relations or episodes: none of them is the subject's.

    async def erase_memories(
        self, subject: str, *, after: str | None, limit: int, now: dt.datetime, dry_run: bool
    ) -> ErasureBatch:
        return ErasureBatch({})

    async def erase_relations(
        self, subject: str, *, after: str | None, limit: int, dry_run: bool
    ) -> ErasureBatch:
        return ErasureBatch({})

    async def erase_episodes(
        self, subject: str, keys: Sequence[str], *, after: str | None, limit: int, dry_run: bool
    ) -> ErasureBatch:
        return ErasureBatch({})
