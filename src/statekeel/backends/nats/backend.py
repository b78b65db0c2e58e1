"""The NATS JetStream backend: sessions, the audit chain and trace spans on replicated streams.

``nats://host:4222`` holds the kinds in :data:`NATS_KINDS`; every other kind's operations raise
``Unsupported`` (see :mod:`statekeel.backends.composite`). ``atomic()`` groups the writes of one session
into one conditional event (see blocks.py): enough for ``sessions.run_tool``, which commits a save and
its step together; JetStream has no transaction spanning several subjects. Paired with a SQL backend
(``nats://host:4222?rest=sqlite:///state.db``), the SQL backend holds the rest. Streams are named
``<prefix>_audit``, ``<prefix>_traces`` and ``<prefix>_meta`` (``prefix=`` in the URL, default
``statekeel``), created with ``replicas=`` copies (default 1; 3 on a cluster) when missing; a stream that
exists with other limits is refused, never changed.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from typing import Any

import orjson

import nats.js.errors

from ...backends.contract.sessions import SESSION_STATUSES
from ...backends.contract.tasks import TASK_STATUSES, WORKFLOW_STATUSES
from ...codec import Codec
from ...errors import MigrationError, SchemaTooNew, StorageCorrupt, Unsupported
from ..base import Incident, MigrationInfo, StateCounts, StorageBackend
from ..composite import refuse_unheld
from .audit import NatsAudit, audit_spec
from .blocks import Block, commit
from .client import WRONG_LAST_SEQUENCE, NatsConnection, StreamSpec, from_micros, micros, parse_nats_url
from .erasure import NatsErasure
from .lease_entries import leases_spec
from .sessions import index_spec, sessions_spec
from .tool_calls import heartbeats_spec
from .traces import traces_spec

__all__ = ["LAYOUT_VERSION", "NATS_KINDS", "NatsBackend", "new_nats_backend"]

NATS_KINDS = frozenset({"lifecycle", "sessions", "tool_calls", "audit", "traces", "erasure"})
"""The state kinds a plain NATS store holds."""

LAYOUT_VERSION = 1
"""The version of the streams' layout (names, subjects, message format) this code writes."""


def meta_spec(prefix: str) -> StreamSpec:
    return StreamSpec(
        f"{prefix}_meta", (f"{prefix}.meta", f"{prefix}.traces_dropped"), max_msgs_per_subject=1
    )


def new_nats_backend(url: str, *, codec: Codec, migrate: bool = True) -> StorageBackend:
    """A :class:`NatsBackend` for ``url`` (not connected yet: ``initialize()`` connects)."""
    # refuse_unheld filled in the operations of the kinds it does not hold, which mypy cannot see.
    factory: Any = NatsBackend
    backend: StorageBackend = factory(url, codec=codec, migrate=migrate)
    return backend


@refuse_unheld
class NatsBackend(NatsErasure, NatsAudit, StorageBackend):
    """Sessions, audit and traces on NATS JetStream; see the module docstring."""

    kinds = NATS_KINDS
    transactional = False
    tables = frozenset({"traces", "audit_log"})

    def __init__(self, url: str, *, codec: Codec, migrate: bool = True) -> None:
        self.url = url
        self.codec = codec
        self.migrate = migrate
        parsed = parse_nats_url(url)
        self.prefix = parsed.prefix
        self.conn = NatsConnection(parsed)
        self._audit_lock = asyncio.Lock()
        self._states = OrderedDict()
        self._block_var = ContextVar(f"statekeel_nats_block_{id(self)}", default=None)
        p = self.prefix
        self._specs = (
            meta_spec(p),
            audit_spec(p),
            traces_spec(p),
            sessions_spec(p),
            index_spec(p),
            heartbeats_spec(p),
            leases_spec(p),
        )
        self._created_at: dt.datetime | None = None

    async def initialize(self) -> None:
        if self.codec.cipher is not None:
            raise Unsupported(
                f"a NATS store ({self.url}) does not encrypt at rest: open it without encryption_key, or "
                "use a SQL store",
                kind="encryption",
                url=self.url,
            )
        await self.conn.connect()
        try:
            if not self.migrate:
                missing = [p for s in self._specs for p in await self.conn.stream_problems(s)]
                if missing:
                    raise MigrationError(
                        "the NATS store is not set up as this statekeel needs and migrate=False: "
                        + "; ".join(missing),
                        hint="Open it once with migrate=True (the default) to create its streams",
                    )
            else:
                for spec in self._specs:
                    await self.conn.ensure_stream(spec)
            await self._check_layout()
        except BaseException:
            await self.conn.close()
            raise

    async def _check_layout(self) -> None:
        stream, subject = f"{self.prefix}_meta", f"{self.prefix}.meta"
        last = await self.conn.last(stream, subject)
        if last is None:
            now = dt.datetime.now(dt.UTC)
            body = orjson.dumps({"layout": LAYOUT_VERSION, "created_at": micros(now)})
            try:
                await self.conn.publish(
                    subject,
                    body,
                    stream=stream,
                    headers={"Nats-Expected-Last-Subject-Sequence": "0"},
                    what="recording the NATS store's layout",
                )
            except nats.js.errors.APIError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:
                    raise
            last = await self.conn.last(stream, subject)
        if last is None or last.data is None:
            raise StorageCorrupt(f"the NATS stream {stream} has no layout record")
        try:
            meta = orjson.loads(last.data)
            layout, created = int(meta["layout"]), int(meta["created_at"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise StorageCorrupt(
                f"the NATS stream {stream} holds no statekeel layout record: {exc}"
            ) from None
        if layout > LAYOUT_VERSION:
            raise SchemaTooNew(
                f"the NATS store {self.prefix!r} has layout {layout}; this statekeel knows up to "
                f"{LAYOUT_VERSION}",
                found=layout,
                supported=LAYOUT_VERSION,
            )
        self._created_at = from_micros(created)

    async def close(self) -> None:
        await self.conn.close()

    def atomic(self) -> AbstractAsyncContextManager[None]:
        """The writes of one session, published together at the end of the outermost block (blocks.py)."""
        return self._atomic()

    @asynccontextmanager
    async def _atomic(self) -> AsyncIterator[None]:
        if self._open_block() is not None:
            yield  # nested: joins the outer block
            return
        block = Block(self.url)
        token = self._block_var.set(block)
        committed = False
        try:
            yield
            block.ended = True  # writes of tasks still running from the block go on their own now
            await commit(self, block)
            committed = True
        finally:
            block.ended = True
            self._block_var.reset(token)
            block.end(committed)

    def in_atomic(self) -> bool:
        return self._open_block() is not None

    def on_block_end(self, callback: Callable[[bool], None]) -> bool:
        block = self._open_block()
        if block is None:
            return False
        block.callbacks.append(callback)
        return True

    async def schema_version(self) -> int:
        return LAYOUT_VERSION

    async def migrations(self) -> list[MigrationInfo]:
        checksum = hashlib.sha256(repr(self._specs).encode()).hexdigest()
        at = self._created_at or dt.datetime.now(dt.UTC)
        return [MigrationInfo(LAYOUT_VERSION, "jetstream_streams", checksum, at)]

    async def integrity_check(self) -> list[str]:
        return [p for spec in self._specs for p in await self.conn.stream_problems(spec)]

    async def pending_migrations(self) -> list[tuple[int, str]]:
        return []

    async def count_state(self) -> StateCounts:
        sessions = dict.fromkeys(SESSION_STATUSES, 0)
        for row in await self._indexed():
            sessions[row["status"]] = sessions.get(row["status"], 0) + 1
        return StateCounts(
            sessions=sessions,
            tasks=dict.fromkeys(TASK_STATUSES, 0),
            workflows=dict.fromkeys(WORKFLOW_STATUSES, 0),
            audit_entries=await self.audit_count(),
        )

    async def list_incidents(self, *, include_acknowledged: bool = False) -> list[Incident]:
        # Damage to replicated streams is the NATS servers' to report; statekeel records none here.
        return []

    async def count_rows(self, table: str) -> int:
        if table == "traces":
            return await self.span_count()
        if table == "audit_log":
            return await self.audit_count()
        if table in ("sessions", "messages", "session_steps"):
            # The rows a SQL store would have for them (each session's state is read: O(sessions)).
            rows = await self._indexed()
            if table == "sessions":
                return len(rows)
            if table == "messages":
                return sum(r["head_seq"] - r["last_consolidated"] for r in rows)
            states = [await self.read_state(r["key"]) for r in rows]
            return sum(1 for st in states for step in st.steps.values() if step is not None)
        raise Unsupported(f"a NATS store holds no table {table!r}", kind="copy", url=self.url)
