"""Backends that hold only some state kinds, and the composite that pairs one with a SQL backend.

A backend that holds some kinds (``StorageBackend.kinds``) is written as a class implementing the
contracts of those kinds and decorated with :func:`refuse_unheld`: every other contract operation raises
``Unsupported`` naming the kind, before anything is written. :class:`CompositeBackend` puts such a backend
in front of a full SQL backend: the kinds it is given go to the first (a NATS store's sessions with their
tool calls, audit chain and traces), everything else to the second.

Where the two meet:

- ``atomic()`` opens the SQL backend's transaction and, with the sessions in front, the front's block
  (one session's writes, one event) inside it: the session's event is published when the block ends,
  then the SQL transaction commits.
- With the audit chain in front, the SQL kinds' audit entries are written to the SQL backend's outbox in
  their change's transaction (as is any entry appended inside a block) and relayed to the chain after
  the commit (:mod:`statekeel.backends.relay`); reads of the chain relay first, so a process reads its
  own entries.
- Erasing a session erases it in front and what belongs to it in SQL (episodes, file records, vectors,
  checkpoints).
"""

from __future__ import annotations

import abc
import datetime as dt
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from typing import Any, TypeVar

from ..errors import InvalidArgument, Unsupported
from .base import (
    ALL_KINDS,
    KIND_CONTRACTS,
    ApprovalRecord,
    AuditRecord,
    CopyTableInfo,
    ErasureBatch,
    StateCounts,
    StorageBackend,
    kind_methods,
)
from .relay import AuditRelay, Chain, Outbox

log = logging.getLogger("statekeel.backends")

B = TypeVar("B", bound=type[StorageBackend])

__all__ = ["CompositeBackend", "pair_backends", "refuse_unheld"]


def _contract_functions() -> Iterator[tuple[str, str, Callable[..., Any]]]:
    """``(kind, name, function)`` of every operation of every kind's contract."""
    for kind, contract in KIND_CONTRACTS.items():
        for name in kind_methods(kind):
            yield kind, name, vars(contract)[name]


def _refusal(kind: str, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def refuse(self: StorageBackend) -> Unsupported:
        return Unsupported(
            f"{type(self).__name__} ({self.url}) does not hold {kind}: {name}() is not available on it",
            kind=kind,
            url=self.url,
        )

    if inspect.iscoroutinefunction(function):

        async def refused_async(self: StorageBackend, *args: Any, **kwargs: Any) -> Any:
            raise refuse(self)

        out: Callable[..., Any] = refused_async
    else:

        def refused(self: StorageBackend, *args: Any, **kwargs: Any) -> Any:
            raise refuse(self)

        out = refused
    out.__name__ = out.__qualname__ = name
    out.__doc__ = f"Not held by this backend: raises ``Unsupported`` (kind {kind!r})."
    return out


def refuse_unheld(cls: B) -> B:
    """Give ``cls`` (a :class:`StorageBackend` whose ``kinds`` names what it holds) a refusing version of
    every abstract contract operation of the kinds it does not hold, so it can be instantiated; an
    operation of a held kind left unimplemented stays abstract (instantiation fails, as it should)."""
    for kind, name, function in _contract_functions():
        if kind in cls.kinds:
            continue
        current = getattr(cls, name, None)
        if current is None or getattr(current, "__isabstractmethod__", False):
            setattr(cls, name, _refusal(kind, name, function))
    abc.update_abstractmethods(cls)
    return cls


def _named(function: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Like ``functools.wraps`` without copying ``__isabstractmethod__``: the delegate is concrete."""

    def name(delegate: Callable[..., Any]) -> Callable[..., Any]:
        delegate.__name__ = delegate.__qualname__ = function.__name__
        delegate.__doc__ = function.__doc__
        return delegate

    return name


def _route_to(kind: str, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(function):

        @_named(function)
        async def delegate_async(self: CompositeBackend, *args: Any, **kwargs: Any) -> Any:
            out = await getattr(self.backend_for(kind), name)(*args, **kwargs)
            if kwargs.get("audit") is not None:
                await self._relay_after_write()  # the write's audit entries went to the outbox
            return out

        return delegate_async

    @_named(function)
    def delegate(self: CompositeBackend, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.backend_for(kind), name)(*args, **kwargs)

    return delegate


# Operations of the copy kind that name their table: a table of a kind held by the first backend is
# answered there (e.g. counting the spans of a NATS trace stream).
_COPY_BY_TABLE = ("count_rows", "export_rows", "last_key", "import_rows", "link_rows", "clear_rows")

# The SQL tables of the kinds a front may hold.
_TABLE_KINDS = {
    "sessions": "sessions",
    "messages": "sessions",
    "compressions": "sessions",
    "message_archive": "sessions",
    "rewound_messages": "sessions",
    "session_steps": "tool_calls",
    "audit_log": "audit",
    "traces": "traces",
}

# Operations listed under one contract that belong to the state of another kind: erasing spans is the
# business of the backend holding the spans (a paired NATS store's trace stream), not the SQL one's.
_KIND_OF_OPERATION = {"purge_traces": "traces", "erasure_spans": "traces", "erase_spans": "traces"}


class CompositeBackend(StorageBackend):
    """A backend holding ``kinds`` (``front``) paired with a SQL backend holding the rest (``rest``).

    See the module docstring for ``atomic()``, the audit outbox and erasure. The schema, migrations,
    integrity and counts are the SQL backend's together with those of ``front``.
    """

    def __init__(self, url: str, front: StorageBackend, rest: StorageBackend, kinds: frozenset[str]) -> None:
        unknown = kinds - front.kinds
        if unknown:
            raise Unsupported(
                f"{front.url} does not hold {sorted(unknown)}", kind=sorted(unknown)[0], url=url
            )
        self.url = url
        self.front = front
        self.rest = rest
        self.front_kinds = kinds
        self._sessions_in_front = "sessions" in kinds
        # What the front holds is not SQL rows: the row copy (backup, export, copy_store) cannot read it,
        # nor retention's batches a session in front; refused whole rather than done for some kinds.
        self.kinds = ALL_KINDS - ({"retention", "copy"} if self._sessions_in_front else {"copy"})
        self.transactional = rest.transactional
        self._audit_key: bytes | None = None
        # The tables whose rows the front holds: counted (and, where it can, copied) there.
        self._tables = frozenset(table for table, kind in _TABLE_KINDS.items() if kind in kinds)
        self._relay: AuditRelay | None = None
        if "audit" in kinds:
            outbox: Outbox = rest  # type: ignore[assignment]  # a SQL backend: sql/audit.py
            chain: Chain = front  # type: ignore[assignment]  # a NATS backend: nats/audit.py
            self._relay = AuditRelay(outbox, chain)
            self.audit_snapshot = False  # entries on NATS, approvals in SQL: see scan_audit
            rest.audit_outbox = True  # type: ignore[attr-defined]

    @property
    def audit_key(self) -> bytes | None:
        return self._audit_key

    @audit_key.setter
    def audit_key(self, key: bytes | None) -> None:
        self._audit_key = key
        self.front.audit_key = key
        self.rest.audit_key = key

    def backend_for(self, kind: str) -> StorageBackend:
        """The backend that holds ``kind`` in this pairing."""
        return self.front if kind in self.front_kinds else self.rest

    async def initialize(self) -> None:
        await self.rest.initialize()
        try:
            await self.front.initialize()
            await self._refuse_state_left_in_sql()
        except BaseException:
            try:
                await self.front.close()
            finally:
                await self.rest.close()
            raise
        await self._relay_after_write()  # entries a process killed before relaying them left behind

    async def _refuse_state_left_in_sql(self) -> None:
        """A SQL store written by a pairing that kept sessions or the audit chain in SQL (``kinds=traces``,
        the pairing of earlier releases) is not read as if it were empty: refused, nothing written."""
        left = []
        if self._sessions_in_front and (n := await self.rest.count_rows("sessions")):
            left.append(f"{n} session(s)")
        if "audit" in self.front_kinds and (n := await self.rest.count_rows("audit_log")):
            left.append(f"{n} audit entr{'y' if n == 1 else 'ies'}")
        if left:
            held = ",".join(k for k in ("sessions", "audit", "traces") if k in self.front_kinds)
            raise InvalidArgument(
                f"the SQL store of {self.url} holds {' and '.join(left)}, which this pairing would keep on "
                f"NATS (kinds={held}): it was written by a pairing that kept them in SQL. Open it with "
                "kinds=traces before rest= (nats://…?kinds=traces&rest=…) to go on with that pairing, or "
                "pair NATS with a new SQL store",
                url=self.url,
            )

    async def close(self) -> None:
        try:
            await self.front.close()
        finally:
            await self.rest.close()

    def atomic(self) -> AbstractAsyncContextManager[None]:
        return self._atomic()

    @asynccontextmanager
    async def _atomic(self) -> AsyncIterator[None]:
        outermost = not self.rest.in_atomic()
        async with self.rest.atomic():
            if self._sessions_in_front:
                # Inner: the session's event is published first, and the SQL transaction commits only
                # once it was stored (a publish refused rolls the SQL writes back).
                async with self.front.atomic():
                    yield
            else:
                yield
        if outermost:
            await self._relay_after_write()

    def in_atomic(self) -> bool:
        return self.rest.in_atomic()

    def on_block_end(self, callback: Callable[[bool], None]) -> bool:
        # A session's outcome is its event's: the front block's, when the block is one.
        if self._sessions_in_front and self.front.in_atomic():
            return self.front.on_block_end(callback)
        return self.rest.on_block_end(callback)

    async def integrity_check(self) -> list[str]:
        return [*await self.rest.integrity_check(), *await self.front.integrity_check()]

    async def count_state(self) -> StateCounts:
        counts = await self.rest.count_state()
        front = await self.front.count_state()
        if self._sessions_in_front:
            counts = replace(counts, sessions=front.sessions)
        if "audit" in self.front_kinds:
            counts = replace(counts, audit_entries=front.audit_entries)
        return counts

    # --- the audit chain in front, the SQL kinds' entries through the outbox ------------------------------

    async def relay_audit(self) -> int:
        """Relay the outbox's entries to the chain now (they are, after each write and before each read of
        the chain); the number relayed. Raises what the relay met (``BackendUnavailable`` …)."""
        return 0 if self._relay is None else await self._relay.run()

    async def _relay_after_write(self) -> None:
        # The change has committed and its entries are safe in the outbox: a relay that fails now (NATS
        # unreachable) must not make the caller think the change failed. The next write, read of the
        # chain, open or recover() relays them; verify() reports them until then.
        if self._relay is None or self.rest.in_atomic():
            return
        try:
            await self._relay.run()
        except Exception:
            lag, oldest = await self.rest.outbox_lag()  # type: ignore[attr-defined]
            log.warning(
                "%d audit entr%s of %s wait in the outbox (oldest from %s): relaying them to the chain "
                "on NATS failed; they are relayed on a later write, read or recover()",
                lag,
                "y" if lag == 1 else "ies",
                self.url,
                oldest,
                exc_info=True,
            )

    async def _relay_before_read(self) -> None:
        if self._relay is not None and not self.rest.in_atomic():
            await self._relay.run()

    async def append_audit(self, kind: str, actor: str, subject: str, data: str) -> AuditRecord:
        if self._relay is None or self.rest.in_atomic():
            # The chain in SQL; or in a block: committed with its SQL writes, relayed after them (seq 0
            # until it is on the chain).
            return await self.rest.append_audit(kind, actor, subject, data)
        await self._relay.run()  # entries of changes committed before this one go first
        return await self.front.append_audit(kind, actor, subject, data)

    async def latest_approval_entry(self, approval_id: str) -> AuditRecord | None:
        await self._relay_before_read()
        return await self.backend_for("audit").latest_approval_entry(approval_id)

    async def read_audit(self, **filters: Any) -> list[AuditRecord]:
        await self._relay_before_read()
        return await self.backend_for("audit").read_audit(**filters)

    async def scan_audit(
        self,
        entries: Callable[[list[AuditRecord]], bool],
        approvals: Callable[[list[ApprovalRecord]], bool],
        *,
        page: int = 1000,
    ) -> None:
        if self._relay is None:
            await self.rest.scan_audit(entries, approvals, page=page)
            return
        # The entries on NATS, then the approvals in SQL: two systems, so not one snapshot (an approval
        # changed in between is seen newer than its entry; AuditLog.verify reads again then).
        await self._relay.run()
        done = False

        def chain_entries(batch: list[AuditRecord]) -> bool:
            nonlocal done
            going = entries(batch)
            done = not going
            return going

        await self.front.scan_audit(chain_entries, lambda _: True, page=page)
        if not done:
            await self.rest.scan_audit(lambda _: True, approvals, page=page)

    async def audit_lag(self) -> tuple[int, dt.datetime | None]:
        if self._relay is None:
            return 0, None
        lag: tuple[int, dt.datetime | None] = await self.rest.outbox_lag()  # type: ignore[attr-defined]
        return lag

    # --- erasure: a session in front, what belongs to it in SQL --------------------------------------------

    async def erasure_sessions(self, subject: str, *, after: str | None, limit: int) -> list[str]:
        return await self.backend_for("sessions").erasure_sessions(subject, after=after, limit=limit)

    async def erase_sessions(
        self, subject: str, keys: Sequence[str], *, now: dt.datetime, dry_run: bool
    ) -> ErasureBatch:
        if not self._sessions_in_front:
            return await self.rest.erase_sessions(subject, keys, now=now, dry_run=dry_run)
        front = await self.front.erase_sessions(subject, keys, now=now, dry_run=dry_run)
        # A session that stayed in front (it no longer names the subject) keeps what belongs to it.
        gone = list(keys) if dry_run else [k for k in keys if await self.front.load_session(k) is None]
        rest = await self.rest.erase_sessions(subject, gone, now=now, dry_run=dry_run)
        counts = dict(rest.counts)
        for kind, n in front.counts.items():
            counts[kind] = counts.get(kind, 0) + n
        return ErasureBatch(counts, None, front.seconds + rest.seconds, front.keys)

    # --- copying ------------------------------------------------------------------------------------------

    async def copy_tables(self) -> list[CopyTableInfo]:
        held = ", ".join(k for k in ("sessions", "audit", "traces") if k in self.front_kinds)
        raise Unsupported(
            f"the {held} of {self.url} are on NATS, which a row copy (backup, export, copy_store) cannot "
            "read: back the NATS streams up with NATS's own tools (nats stream backup) and the SQL store "
            "on its own (statekeel backup of its own URL)",
            kind="copy",
            url=self.url,
        )

    async def count_rows(self, table: str) -> int:
        return await self._copy_backend(table).count_rows(table)

    def _copy_backend(self, table: str) -> StorageBackend:
        return self.front if table in self._tables else self.rest

    def __getattr__(self, name: str) -> Any:
        # Backend-specific helpers (not part of the contract) are the SQL backend's; but not its file:
        # an online backup of it alone would leave out what is on NATS (backup copies row by row here).
        if name.startswith("__") or name in ("front", "rest", "path"):
            raise AttributeError(name)
        return getattr(self.rest, name)


def _fill_composite() -> None:
    cls: Any = CompositeBackend
    own = set(vars(cls))
    for kind, name, function in _contract_functions():
        if name in own:
            continue
        if kind == "copy" and name in _COPY_BY_TABLE:
            setattr(cls, name, _route_by_table(name, function))
            continue
        setattr(cls, name, _route_to(_KIND_OF_OPERATION.get(name, kind), name, function))
    abc.update_abstractmethods(cls)


def _route_by_table(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @_named(function)
    async def delegate(self: CompositeBackend, table: str, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self._copy_backend(table), name)(table, *args, **kwargs)

    return delegate


_fill_composite()


def pair_backends(
    url: str, front: StorageBackend, rest: StorageBackend, kinds: frozenset[str]
) -> StorageBackend:
    """A :class:`CompositeBackend`: ``kinds`` held by ``front``, the rest by ``rest``."""
    # _fill_composite gave the class every contract operation, which mypy cannot see.
    factory: Any = CompositeBackend
    backend: StorageBackend = factory(url, front, rest, kinds)
    return backend
