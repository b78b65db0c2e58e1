"""Logic shared by the SQL backends.

Each state-semantic operation is written once, as an ``async def op(tx, ...)`` over a small :class:`Tx`
interface whose queries are looked up by name in the dialect's ``.sql`` files. A dialect supplies the
:class:`Tx` and runs operations in a transaction:

- SQLite runs the whole operation as one job on its writer thread. Its ``Tx`` methods never suspend, so the
  coroutine completes in a single ``send(None)`` (:func:`run_sync`): one thread hop per operation, and
  concurrent operations can share one commit (group commit).
- PostgreSQL awaits the same coroutine on a pooled asyncpg connection.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import datetime as dt
import logging
import re
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from importlib import resources
from typing import Any, Protocol, TypeVar

import orjson

from ...codec import Codec
from ..base import StorageBackend

T = TypeVar("T")

# Every table of the current schema: what a dialect's integrity check expects to find.
SCHEMA_TABLES = (
    "sessions",
    "messages",
    "compressions",
    "message_archive",
    "rewound_messages",
    "workflows",
    "tasks",
    "workflow_steps",
    "task_steps",
    "schedules",
    "audit_log",
    "approvals",
    "memories",
    "memory_events",
    "memory_episodes",
    "memory_relations",
    "memory_contradictions",
    "memory_accesses",
    "file_changes",
    "traces",
    "trace_counters",
    "vector_models",
    "vectors",
    "vector_sources",
    "vector_cursors",
    "checkpoints",
    "checkpoint_blobs",
    "checkpoint_writes",
    "store_incidents",
)


log = logging.getLogger("statekeel.backends")

_NAME_RE = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def load_queries(package: str) -> dict[str, str]:
    """Read every ``*.sql`` file of a dialect package (not its migrations) into ``{name: sql}``.

    Each query starts with a ``-- name: query_name`` line and runs to the next one.
    """
    queries: dict[str, str] = {}
    root = resources.files(package)
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text(encoding="utf-8")
        parts = _NAME_RE.split(text)
        # parts = [preamble, name1, body1, name2, body2, ...]
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise RuntimeError(f"query {name!r} is defined twice in {package}")
            queries[name] = body.strip().rstrip(";")
    return queries


class Row(Protocol):
    def __getitem__(self, key: str | int, /) -> Any: ...


class Tx(abc.ABC):
    """What an operation can do inside a transaction. Queries are referred to by name."""

    codec: Codec
    # The dialect keeps sealed segments of older messages (see segments.py): its schema has the table.
    segments: bool = False

    @abc.abstractmethod
    async def execute(self, name: str, *args: Any) -> int:
        """Run a statement; return the number of rows it changed."""

    @abc.abstractmethod
    async def executemany(self, name: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run a statement once per row of arguments."""

    @abc.abstractmethod
    async def fetchone(self, name: str, *args: Any) -> Row | None: ...

    @abc.abstractmethod
    async def fetchall(self, name: str, *args: Any) -> list[Row]: ...

    @abc.abstractmethod
    def ts_in(self, value: dt.datetime) -> Any:
        """A timezone-aware datetime as the dialect stores it."""

    @abc.abstractmethod
    def ts_out(self, value: Any) -> dt.datetime:
        """A stored timestamp back as an aware UTC datetime."""

    def json_in(self, raw: bytes) -> Any:
        """Codec output (JSON bytes) as the dialect's JSON parameter."""
        return raw.decode("utf-8")

    def array_in(self, values: list[str | None]) -> Any:
        """A list of texts as the dialect's array parameter (a JSON array unless it has arrays)."""
        return orjson.dumps(values).decode("utf-8")

    def json_out(self, value: Any) -> Any:
        """A stored JSON column back to Python values (tagged types restored)."""
        return self.codec.decode(value)

    # Encrypted fields (see statekeel.codec.encryption): ``kind`` and ``identity`` name the record, and are
    # authenticated with the ciphertext, so a value moved to another row does not open.

    def sealed_in(self, raw: bytes, kind: str, *identity: str | int, subject: str | None = None) -> Any:
        """:meth:`json_in` of an encrypted field: sealed under the store's current key, if it has one (with
        a key ring: under the data key of the message's session, or of ``subject``)."""
        cipher = self.codec.cipher
        return self.json_in(raw if cipher is None else cipher.seal(raw, kind, identity, subject))

    def sealed_out(self, value: Any, kind: str, *identity: str | int) -> Any:
        """:meth:`json_out` of an encrypted field: opened with the store's keys, if it has any."""
        cipher = self.codec.cipher
        if cipher is None:
            return self.json_out(value)
        return cipher.decode(self.codec, orjson.loads(value), kind, identity)


Op = Callable[..., Coroutine[Any, Any, T]]
OpT = TypeVar("OpT", bound=Callable[..., Coroutine[Any, Any, Any]])

_UNCONDITIONAL = "statekeel_unconditional"


def unconditional(op: OpT) -> OpT:
    """Mark ``op`` as an unconditional write: what it writes depends only on its arguments and on what it
    reads inside its own transaction, never on what its caller read before (a memory put or forget, not an
    append at an expected head). A dialect whose server rolls a whole transaction back under it (an InnoDB
    deadlock) may run such an operation again, several times, where a conditional write gets one retry and
    then its ``ConflictError``."""
    setattr(op, _UNCONDITIONAL, True)
    return op


def is_unconditional(op: Callable[..., Any]) -> bool:
    """Whether ``op`` was marked with :func:`unconditional`."""
    return getattr(op, _UNCONDITIONAL, False) is True


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Drive a coroutine that never suspends (a SQLite operation) to completion, synchronously."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a SQLite operation suspended; operations must only await Tx methods")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def to_micros(value: dt.datetime) -> int:
    """Microseconds since the Unix epoch (exact, unlike float seconds)."""
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(value: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=value)


class BlockEnd:
    """The outcome of one outermost ``atomic()`` block and what waits for it."""

    __slots__ = ("callbacks", "committed")

    def __init__(self) -> None:
        self.committed = False
        self.callbacks: list[Callable[[bool], None]] = []

    def ended(self) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks if self.committed else reversed(callbacks):
            try:
                callback(self.committed)
            except Exception:  # the outcome is settled: one bad callback must not hide it from the rest
                log.exception("a callback run at the end of an atomic() block failed")


class SqlBackend(StorageBackend):
    """A backend whose operations are shared SQL logic; dialects implement the hooks below."""

    codec: Codec
    # Set by a NATS pairing whose audit chain is on NATS: audit entries go to the outbox (sql/audit.py).
    audit_outbox: bool = False

    def __init__(self, url: str, *, codec: Codec) -> None:
        self.url = url
        self.codec = codec
        # The transaction of the current task's ``atomic()`` block, if any, keyed by backend.
        self._current: contextvars.ContextVar[Any] = contextvars.ContextVar(
            f"statekeel_tx_{id(self)}", default=None
        )
        # What runs once the current outermost block has ended (see on_block_end).
        self._block_end: contextvars.ContextVar[BlockEnd | None] = contextvars.ContextVar(
            f"statekeel_block_end_{id(self)}", default=None
        )

    def in_atomic(self) -> bool:
        return self._current.get() is not None

    def on_block_end(self, callback: Callable[[bool], None]) -> bool:
        block = self._block_end.get()
        if block is None:
            return False
        block.callbacks.append(callback)
        return True

    @contextlib.contextmanager
    def _outermost_block(self) -> Iterator[BlockEnd]:
        """Scope of an outermost ``atomic()`` block: the dialect sets ``committed`` once its COMMIT
        succeeded; on the way out the callbacks learn the outcome (also when the block was cancelled)."""
        block = BlockEnd()
        token = self._block_end.set(block)
        try:
            yield block
        finally:
            self._block_end.reset(token)
            block.ended()

    @abc.abstractmethod
    async def _write(self, op: Op[T], *args: Any) -> T:
        """Run ``op(tx, *args)`` in a write transaction (or the caller's ``atomic()`` block)."""

    async def _write_bulk(self, op: Op[T], *args: Any) -> T:
        """A write that may take a while (a batch of a purge or a key rotation); SQLite runs it on its
        writer thread rather than inline on the event loop's."""
        return await self._write(op, *args)

    @abc.abstractmethod
    async def _read(self, op: Op[T], *args: Any) -> T:
        """Run ``op(tx, *args)`` on a consistent snapshot (or inside the caller's ``atomic()`` block)."""

    @abc.abstractmethod
    def atomic(self) -> AbstractAsyncContextManager[None]: ...


__all__ = [
    "BlockEnd",
    "Op",
    "Row",
    "SqlBackend",
    "Tx",
    "from_micros",
    "is_unconditional",
    "load_queries",
    "run_sync",
    "to_micros",
    "unconditional",
    "utcnow",
]
