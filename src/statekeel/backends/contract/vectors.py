"""Embeddings (the derived tier) and what lags behind its sources."""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Lag",
    "Vector",
    "VectorBackend",
    "VectorModelState",
    "VectorRows",
    "VectorWrite",
]


@dataclass(frozen=True, slots=True)
class Vector:
    """A stored embedding. ``embedding`` holds its float32 values (as Python floats); ``source_version``
    is the version of the source it was computed from (None: not said)."""

    vec_id: str
    model: str
    source_id: str
    source_version: int | None
    embedding: tuple[float, ...]
    metadata: dict[str, Any]
    updated_at: dt.datetime

    @property
    def dim(self) -> int:
        return len(self.embedding)


@dataclass(frozen=True, slots=True)
class VectorWrite:
    """A validated embedding to store: ``embedding`` is ``dim`` little-endian float32 values.

    ``vec_id=None`` (a rebuild) replaces every vector of the source in ``model`` by this one, keeping the
    first one's id and metadata. ``metadata`` is codec-encoded JSON; None keeps what is stored (``{}`` for a
    new vector)."""

    vec_id: str | None
    model: str
    source_id: str
    source_version: int | None
    embedding: bytes
    dim: int
    metadata: bytes | None = None


@dataclass(frozen=True, slots=True)
class VectorModelState:
    """An embedding model of the index: its dimension and its change counters (``generation`` grows at
    every change of its vectors, ``removals`` at every deletion)."""

    model: str
    dim: int
    generation: int
    removals: int


@dataclass(frozen=True, slots=True)
class VectorRows:
    """Vectors of one model read on one snapshot with the model's state: all of them (``full``), or those
    written after a given generation. Each row is ``(vec_id, source_id, embedding, metadata, generation)``."""

    state: VectorModelState | None
    full: bool
    rows: list[tuple[str, str, bytes, dict[str, Any], int]]


@dataclass(frozen=True, slots=True)
class Lag:
    """A source whose vectors are behind it: ``kind`` is "memory" (a memory's id) or "external" (announced
    with ``source_changed``); ``version`` is the source's version, ``indexed_version`` the newest version
    among its vectors (None: no vector says one). ``changed_at`` orders the listing."""

    source_id: str
    kind: str
    version: int
    indexed_version: int | None
    changed_at: dt.datetime


class VectorBackend(abc.ABC):
    """Embeddings (the derived tier) and the sources they follow."""

    @abc.abstractmethod
    async def upsert_vectors(self, writes: Sequence[VectorWrite], *, at: dt.datetime) -> list[str]:
        """Store the vectors in one transaction; returns their ids. The first vector of a model fixes its
        dimension: ``DimensionMismatch`` for another one, ``InvalidArgument`` for an id stored under another
        model (nothing written either way). Each source's ``indexed_version`` follows its vectors."""

    @abc.abstractmethod
    async def delete_vector(self, vec_id: str) -> bool:
        """Delete one vector; False when there was none."""

    @abc.abstractmethod
    async def vectors_by_source(self, source_id: str) -> list[Vector]:
        """The source's vectors, by model then id."""

    @abc.abstractmethod
    async def vector_models(self) -> list[VectorModelState]:
        """Every model of the index, by name."""

    @abc.abstractmethod
    async def vector_model(self, model: str) -> VectorModelState | None: ...

    @abc.abstractmethod
    async def load_vectors(self, model: str, *, since: tuple[int, int] | None = None) -> VectorRows:
        """The model's state and its vectors: all of them, or — given ``since``, the ``(generation,
        removals)`` a cache holds — those written after that generation, unless a vector was deleted since
        (``removals`` moved on), when all of them are read (``full``)."""

    @abc.abstractmethod
    async def source_changed(self, source_id: str, version: int, *, at: dt.datetime) -> None:
        """Record that a source is at ``version`` (an older version than the one recorded is ignored; a
        source marked gone comes back)."""

    @abc.abstractmethod
    async def sources_gone(self, source_ids: Sequence[str], *, at: dt.datetime) -> int:
        """Mark sources gone (their vectors are purged later); returns how many were not gone yet."""

    @abc.abstractmethod
    async def sync_vector_sources(
        self, *, overlap: dt.timedelta, start: tuple[dt.datetime, str] | None, limit: int
    ) -> tuple[int, tuple[dt.datetime, str] | None]:
        """Read up to ``limit`` memory changes after ``start`` (None: from the stored cursor less
        ``overlap``) into the sources table, in one transaction, and move the cursor. Returns the number of
        changes read and the key of the last one."""

    @abc.abstractmethod
    async def lagging_sources(self, *, limit: int, after: tuple[dt.datetime, str] | None = None) -> list[Lag]:
        """Sources (not gone) whose vectors are missing or older, by ``changed_at`` then id, after
        ``after``."""

    @abc.abstractmethod
    async def count_lagging(self) -> int: ...
