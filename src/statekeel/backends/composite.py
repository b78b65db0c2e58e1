"""Backends that hold only some state kinds, and the composite that pairs one with a SQL backend.

A backend that holds some kinds (``StorageBackend.kinds``) is written as a class implementing the
contracts of those kinds and decorated with :func:`refuse_unheld`: every other contract operation raises
``Unsupported`` naming the kind, before anything is written. :class:`CompositeBackend` puts such a backend
in front of a full SQL backend: the kinds it is given go to the first, everything else (transactions,
schema, the kinds that write audit entries in their own transaction) to the second.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from ..errors import Unsupported
from .base import ALL_KINDS, KIND_CONTRACTS, StorageBackend, kind_methods

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
            return await getattr(self.backend_for(kind), name)(*args, **kwargs)

        return delegate_async

    @_named(function)
    def delegate(self: CompositeBackend, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.backend_for(kind), name)(*args, **kwargs)

    return delegate


# Operations of the copy kind that name their table: a table of a kind held by the first backend is
# answered there (e.g. counting the spans of a NATS trace stream).
_COPY_BY_TABLE = ("count_rows", "export_rows", "last_key", "import_rows", "link_rows", "clear_rows")

# Operations listed under one contract that belong to the state of another kind: erasing spans is the
# business of the backend holding the spans (a paired NATS store's trace stream), not the SQL one's.
_KIND_OF_OPERATION = {"purge_traces": "traces", "erasure_spans": "traces", "erase_spans": "traces"}


class CompositeBackend(StorageBackend):
    """A backend holding ``kinds`` (``front``) paired with a SQL backend holding the rest (``rest``).

    ``atomic()`` is the SQL backend's: writes to ``front`` inside a block are not part of its transaction
    (they commit on their own, before the block ends). The schema, migrations, integrity and counts are
    the SQL backend's too, together with those of ``front``.
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
        self.kinds = ALL_KINDS
        self.transactional = rest.transactional
        self._audit_key: bytes | None = None
        self._tables: frozenset[str] = getattr(front, "tables", frozenset())

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
        except BaseException:
            await self.rest.close()
            raise

    async def close(self) -> None:
        try:
            await self.front.close()
        finally:
            await self.rest.close()

    def atomic(self) -> AbstractAsyncContextManager[None]:
        return self.rest.atomic()

    def in_atomic(self) -> bool:
        return self.rest.in_atomic()

    def on_block_end(self, callback: Callable[[bool], None]) -> bool:
        return self.rest.on_block_end(callback)

    async def integrity_check(self) -> list[str]:
        return [*await self.rest.integrity_check(), *await self.front.integrity_check()]

    async def count_rows(self, table: str) -> int:
        return await self._copy_backend(table).count_rows(table)

    def _copy_backend(self, table: str) -> StorageBackend:
        return self.front if table in self._tables else self.rest

    def __getattr__(self, name: str) -> Any:
        # Backend-specific helpers (not part of the contract) are the SQL backend's.
        if name.startswith("__") or name in ("front", "rest"):
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
