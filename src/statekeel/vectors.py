"""Vectors: embeddings of memories and other sources, the derived tier.

    await store.vectors.upsert("m-1", memory.id, embedding, model="minilm", source_version=memory.version)
    hits = await store.vectors.search(query_embedding, k=5, model="minilm", filter={"scope": "user:42"})
    for lag in await store.vectors.lagging():
        ...                                     # sources whose vector is missing or older than they are
    await store.vectors.rebuild(embed, model="minilm")   # embed what lags, in committed batches

statekeel never embeds by itself: ``embed`` is yours (sync or async, a list of texts in, one embedding
per text out). Embeddings are stored as float32, one dimension per model (fixed by its first vector; another
one raises ``DimensionMismatch``); NaN, infinities and all-zero vectors raise ``InvalidEmbedding``.

**Derived tier.** Nothing a memory write does touches vectors: ``memory.put`` never waits for an
embedding. The index follows the memories by reading their changes (``memories`` by ``updated_at``) when
``lagging()``, ``rebuild()`` or ``recover()`` asks, from a stored cursor less :data:`CHANGE_OVERLAP` (a
writer whose clock runs behind by less than that is still seen). A source lags while none of its vectors
was made from its current version (``source_version``): memories by their ``version``, other sources by
what ``source_changed(source_id, version)`` announced. Vectors whose source is gone (a forgotten or
superseded memory, a source given to ``source_deleted``) stay searchable until ``store.purge()`` removes
them once the retention grace period of memories has passed.

**Search** is exact cosine similarity, highest first; equal scores are ordered by ``vec_id``. The score is
defined once — float32 values widened to float64, products summed left to right, divided by the two norms
computed the same way — so the numpy path (``statekeel[vectors]``) and the pure-Python path return the same
hits with the same scores. numpy ranks every vector with one float32 matrix product, then recomputes the
exact score of the vectors within that product's error bound of the k-th; each model's matrix is cached in
the process and brought up to date from the model's change counter (a deleted vector reloads it).

**Another engine.** ``search`` hands a :class:`SearchRequest` to ``vectors.engine`` (any object with
``async def search(self, request) -> list[Hit]``): ``store.vectors.engine = MyPgvectorSearch(store)`` puts
sqlite-vec, pgvector or a remote index behind the same call. :class:`ExactSearch` is the default.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import heapq
import inspect
import math
import numbers
import operator
import struct
import sys
from array import array
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .backends.base import Lag, StorageBackend, Vector, VectorRows, VectorWrite
from .codec import Codec
from .errors import DimensionMismatch, InvalidArgument, InvalidEmbedding
from .validation import check_int, check_key

try:  # the optional extra statekeel[vectors]
    import numpy as np
except ImportError:  # pragma: no cover - exercised where numpy is missing
    np = None  # type: ignore[assignment]

MAX_DIM = 65_536
# Memory changes are re-read from this far before the stored cursor: clocks of other writers may lag.
CHANGE_OVERLAP = dt.timedelta(seconds=30)
_SYNC_BATCH = 1000
# Below this many vectors a search runs on the event loop's thread: a thread hop would cost more.
_INLINE_ROWS = 2000
_LITTLE = sys.byteorder == "little"

Embedding = Sequence[float] | Any  # a sequence of numbers or a 1-D numpy array
EmbedFn = Callable[[list[str]], Sequence[Embedding] | Awaitable[Sequence[Embedding]]]
TextFn = Callable[[str], str | Awaitable[str | None] | None]


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result: ``score`` is the cosine similarity in [-1, 1] (highest first)."""

    vec_id: str
    source_id: str
    score: float
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SearchRequest:
    """What :meth:`VectorIndex.search` hands its engine, validated: the model (None only when the index
    has no model yet), its dimension, the query as float32 values, ``k`` and the metadata filter."""

    model: str | None
    dim: int
    query: tuple[float, ...]
    k: int
    filter: Mapping[str, Any] | None


class SearchEngine(Protocol):
    """The seam behind ``search``: anything that answers a :class:`SearchRequest` with up to ``k`` hits,
    best first, each meeting the filter (every key of ``filter`` equal in the hit's metadata)."""

    async def search(self, request: SearchRequest) -> list[Hit]:
        """The ``request.k`` best hits of ``request`` (see :class:`SearchRequest`), best first."""
        ...


# --- the score, defined once ------------------------------------------------------------------------------


def _seqsum(values: Iterable[float]) -> float:
    """Left-to-right float64 sum (not ``sum``: from Python 3.12 it compensates, numpy's cumsum does not)."""
    return functools.reduce(operator.add, values)


def exact_score(vector: Sequence[float], vnorm: float, query: Sequence[float], qnorm: float) -> float:
    """The cosine similarity as statekeel defines it (see the module documentation)."""
    return _seqsum(map(operator.mul, vector, query)) / (vnorm * qnorm)


def exact_norm(vector: Sequence[float]) -> float:
    return math.sqrt(_seqsum(map(operator.mul, vector, vector)))


def _matches(metadata: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return all(key in metadata and metadata[key] == value for key, value in wanted.items())


def _ranked(candidates: Iterable[tuple[float, str, str, dict[str, Any]]], k: int) -> list[Hit]:
    # Highest score first, then vec_id: the one order both paths share.
    best = heapq.nsmallest(k, candidates, key=lambda c: (-c[0], c[1]))
    return [Hit(vec_id, source_id, score, metadata) for score, vec_id, source_id, metadata in best]


# --- validation ---------------------------------------------------------------------------------------


def to_float32(values: Any, what: str, *, model: str | None = None) -> tuple[bytes, tuple[float, ...]]:
    """``values`` as little-endian float32 bytes and as the Python floats they hold; raises
    ``InvalidEmbedding`` for anything that is not a finite, non-zero vector of numbers."""
    if np is not None and isinstance(values, np.ndarray):
        if values.ndim != 1 or values.dtype.kind not in "iuf":
            raise InvalidEmbedding(
                f"{what} must be a 1-D array of numbers, got shape {values.shape} of {values.dtype}",
                model=model,
            )
        items: list[Any] = values.tolist()
    elif isinstance(values, str | bytes | bytearray | Mapping) or not isinstance(values, Iterable):
        raise InvalidEmbedding(
            f"{what} must be a sequence of numbers, got {type(values).__name__}", model=model
        )
    else:
        items = list(values)
    if not items:
        raise InvalidEmbedding(f"{what} is empty", model=model)
    if len(items) > MAX_DIM:
        raise InvalidEmbedding(f"{what} has {len(items)} values, over the limit of {MAX_DIM}", model=model)
    floats: list[float] = []
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, numbers.Real):
            raise InvalidEmbedding(f"{what}[{i}] is {item!r}, not a number", model=model, index=i)
        floats.append(float(item))
    packed = array("f", floats)
    for i, value in enumerate(packed):
        if not math.isfinite(value):
            why = "NaN or infinite" if not math.isfinite(floats[i]) else "out of float32 range"
            raise InvalidEmbedding(f"{what}[{i}] is {floats[i]!r}: {why}", model=model, index=i)
    if not any(packed):
        raise InvalidEmbedding(f"{what} is all zeros: it has no direction to compare", model=model)
    if not _LITTLE:
        packed.byteswap()
    raw = packed.tobytes()
    return raw, struct.unpack(f"<{len(floats)}f", raw)


def _check_metadata(metadata: Any) -> Mapping[str, Any] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping) or not all(type(k) is str for k in metadata):
        raise InvalidArgument(f"metadata must be a dict with str keys, got {metadata!r}")
    return metadata


def _check_version(version: Any, what: str) -> int:
    return check_int(version, what, minimum=0)


# --- the exact engine ---------------------------------------------------------------------------------------


class _ModelCache:
    """One model's vectors in this process, as of ``generation``; numpy rows or Python arrays."""

    def __init__(self, dim: int, use_numpy: bool) -> None:
        self.dim = dim
        self.use_numpy = use_numpy
        self.generation = -1
        self.removals = -1
        self.ids: list[str] = []
        self.sources: list[str] = []
        self.metadata: list[dict[str, Any]] = []
        self.position: dict[str, int] = {}
        self.rows: list[Sequence[float]] = []  # Python path
        self.norms_py: list[float] = []
        self.matrix: Any = None  # numpy path: float32 (capacity x dim), the first len(ids) rows in use
        self.norms: Any = None  # float64, canonical norms
        self.masks: dict[str, Any] = {}  # filter -> which rows match, until the next change
        self.lock = asyncio.Lock()

    def load(self, found: VectorRows) -> None:
        assert found.state is not None
        if found.full:
            self.ids, self.sources, self.metadata, self.position = [], [], [], {}
            self.rows, self.norms_py = [], []
            self.matrix = self.norms = None
        new = [r for r in found.rows if r[0] not in self.position]
        changed = [r for r in found.rows if r[0] in self.position]
        if self.use_numpy:
            self._load_numpy(new, changed)
        else:
            for vec_id, _, raw, _, _ in changed:
                i = self.position[vec_id]
                self.rows[i] = _decode(raw)
                self.norms_py[i] = exact_norm(self.rows[i])
            for _, _, raw, _, _ in new:
                row = _decode(raw)
                self.rows.append(row)
                self.norms_py.append(exact_norm(row))
        for vec_id, source_id, _, metadata, _ in changed:
            i = self.position[vec_id]
            self.sources[i] = source_id
            self.metadata[i] = metadata
        for vec_id, source_id, _, metadata, _ in new:
            self.position[vec_id] = len(self.ids)
            self.ids.append(vec_id)
            self.sources.append(source_id)
            self.metadata.append(metadata)
        self.generation = found.state.generation
        self.removals = found.state.removals
        self.masks = {}

    def _load_numpy(self, new: list[Any], changed: list[Any]) -> None:
        n = len(self.ids)
        if changed:
            block = _block([r[2] for r in changed], self.dim)
            where = np.fromiter((self.position[r[0]] for r in changed), dtype=np.int64, count=len(changed))
            self.matrix[where] = block
            self.norms[where] = _norms(block)
        if new:
            block = _block([r[2] for r in new], self.dim)
            need = n + len(new)
            if self.matrix is None or need > self.matrix.shape[0]:
                # Room to grow: a vector stored after a full load must not copy the whole matrix.
                capacity = max(need + need // 4, 2 * (0 if self.matrix is None else self.matrix.shape[0]), 64)
                matrix = np.empty((capacity, self.dim), dtype=np.float32)
                norms = np.empty(capacity, dtype=np.float64)
                if n:
                    matrix[:n] = self.matrix[:n]
                    norms[:n] = self.norms[:n]
                self.matrix, self.norms = matrix, norms
            self.matrix[n:need] = block
            self.norms[n:need] = _norms(block)

    def search(self, query: tuple[float, ...], k: int, wanted: Mapping[str, Any] | None) -> list[Hit]:
        qnorm = exact_norm(query)
        keep = None if wanted is None else self._mask(wanted)
        if self.use_numpy:
            return self._search_numpy(query, qnorm, k, keep)
        rows, norms, ids, sources, metas = self.rows, self.norms_py, self.ids, self.sources, self.metadata
        candidates = (
            (exact_score(rows[i], norms[i], query, qnorm), ids[i], sources[i], metas[i])
            for i in range(len(ids))
            if keep is None or keep[i]
        )
        return _ranked(candidates, k)

    def _mask(self, wanted: Mapping[str, Any]) -> Any:
        # An agent filters by the same few keys again and again: each filter is evaluated once per change.
        key = repr(sorted(wanted.items()))
        mask = self.masks.get(key)
        if mask is None:
            mask = [_matches(m, wanted) for m in self.metadata]
            if self.use_numpy:
                mask = np.asarray(mask, dtype=bool)
            self.masks[key] = mask
        return mask

    def _search_numpy(self, query: tuple[float, ...], qnorm: float, k: int, keep: Any) -> list[Hit]:
        n = len(self.ids)
        if n == 0:
            return []
        matrix, norms = self.matrix[:n], self.norms[:n]
        q64 = np.asarray(query, dtype=np.float64)
        # A float32 product ranks every vector; its error is at most `bound` (cosine units) when norms are
        # in a range where float32 neither overflows nor loses precision to underflow.
        safe = bool(norms.min() > 1e-15 and norms.max() < 1e15)
        if safe:
            fast = (matrix @ (q64 / qnorm).astype(np.float32)).astype(np.float64) / norms
        else:
            fast = np.concatenate([m.astype(np.float64) @ q64 for m in _chunks(matrix)]) / (norms * qnorm)
        bound = (self.dim + 4) * 2.0**-23 if safe else (self.dim + 4) * 2.0**-50
        if keep is not None:
            fast[~keep] = -np.inf
            live = int(np.count_nonzero(np.isfinite(fast)))
        else:
            live = n
        if live == 0:
            return []
        if live <= k:
            chosen = np.flatnonzero(np.isfinite(fast))
        else:
            kth = np.partition(fast, n - k)[n - k]
            chosen = np.flatnonzero(fast >= kth - 2 * bound)
        # The exact score of every candidate, computed as the Python path does (sequential float64 sums).
        rows = matrix[chosen].astype(np.float64)
        dots = np.cumsum(rows * q64, axis=1)[:, -1] / (norms[chosen] * qnorm)
        ids, sources, metas = self.ids, self.sources, self.metadata
        scored = zip(dots.tolist(), chosen.tolist(), strict=True)
        return _ranked(((s, ids[i], sources[i], metas[i]) for s, i in scored), k)


def _block(raws: list[bytes], dim: int) -> Any:
    return np.frombuffer(b"".join(raws), dtype="<f4").reshape(len(raws), dim)


def _chunks(matrix: Any, rows: int = 8192) -> list[Any]:
    return [matrix[i : i + rows] for i in range(0, matrix.shape[0], rows)]


def _norms(block: Any) -> Any:
    """Canonical norms of float32 rows: float64 squares summed left to right, in chunks (bounded memory)."""
    out = []
    for part in _chunks(block):
        wide = part.astype(np.float64)
        out.append(np.sqrt(np.cumsum(wide * wide, axis=1)[:, -1]))
    return np.concatenate(out) if out else np.empty(0, dtype=np.float64)


def _decode(raw: bytes) -> Sequence[float]:
    values = array("f")
    values.frombytes(raw)
    if not _LITTLE:
        values.byteswap()
    return values


class ExactSearch:
    """Exact cosine search over the store's ``vectors`` table, with a per-model cache in this process.

    ``use_numpy=None`` uses numpy when it is installed; False forces the pure-Python path (same answers).
    """

    def __init__(self, backend: StorageBackend, *, use_numpy: bool | None = None) -> None:
        if use_numpy and np is None:
            raise InvalidArgument("use_numpy=True needs numpy: pip install 'statekeel[vectors]'")
        self.backend = backend
        self.use_numpy = np is not None if use_numpy is None else use_numpy
        self._caches: dict[str, _ModelCache] = {}

    async def search(self, request: SearchRequest) -> list[Hit]:
        """The ``request.k`` best hits by exact cosine similarity over the stored vectors of
        ``request.model`` (none without a model), best first."""
        if request.model is None:
            return []
        cache = self._caches.get(request.model)
        if cache is None or cache.dim != request.dim:
            cache = self._caches[request.model] = _ModelCache(request.dim, self.use_numpy)
        async with cache.lock:
            # One snapshot read tells whether anything changed, and brings the cache up to date if so.
            since = None if cache.generation < 0 else (cache.generation, cache.removals)
            state = await self.backend.vector_model(request.model)
            if state is None:
                return []
            if (state.generation, state.removals) != (cache.generation, cache.removals):
                found = await self.backend.load_vectors(request.model, since=since)
                cache.load(found)
            if len(cache.ids) < _INLINE_ROWS:
                return cache.search(request.query, request.k, request.filter)
            return await asyncio.to_thread(cache.search, request.query, request.k, request.filter)


# --- the index ----------------------------------------------------------------------------------------------


class VectorIndex:
    """``store.vectors``: embeddings by source, exact similarity search, lag tracking and rebuilds.

    See the module documentation. Every method checks its arguments before anything is written.
    """

    def __init__(self, backend: StorageBackend, codec: Codec, *, engine: SearchEngine | None = None) -> None:
        self.backend = backend
        self.codec = codec
        self.engine: SearchEngine = engine if engine is not None else ExactSearch(backend)
        self._dims: dict[str, int] = {}

    # --- writing ---------------------------------------------------------------------------------------

    async def upsert(
        self,
        vec_id: str,
        source_id: str,
        embedding: Embedding,
        *,
        model: str,
        source_version: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Store (or replace) the embedding ``vec_id`` of ``source_id`` under ``model``.

        ``source_version`` is the version of the source it was computed from (a memory's ``version``):
        without it the source keeps being reported by :meth:`lagging`. ``metadata`` (a JSON object, kept
        when None on a replace) is returned with each hit and matched by ``search(filter=...)``.
        """
        check_key(vec_id, "vec_id")
        check_key(source_id, "source_id")
        check_key(model, "model")
        raw, values = to_float32(embedding, "embedding", model=model)
        self.check_dim(model, len(values))
        version = None if source_version is None else _check_version(source_version, "source_version")
        meta = _check_metadata(metadata)
        write = VectorWrite(
            vec_id=vec_id,
            model=model,
            source_id=source_id,
            source_version=version,
            embedding=raw,
            dim=len(values),
            metadata=None if meta is None else self.codec.encode(dict(meta), where="metadata"),
        )
        await self._write([write])

    async def _write(self, writes: list[VectorWrite]) -> list[str]:
        try:
            written = await self.backend.upsert_vectors(writes, at=dt.datetime.now(dt.UTC))
        except DimensionMismatch as exc:
            self._dims[exc.fields["model"]] = exc.fields["expected"]
            raise
        for w in writes:
            self._dims.setdefault(w.model, w.dim)
        return written

    def check_dim(self, model: str, dim: int) -> None:
        """Raise ``DimensionMismatch`` when ``dim`` is not the dimension of ``model``'s vectors as last seen
        (before a write; the backend checks again in the write's transaction)."""
        expected = self._dims.get(model)
        if expected is not None and expected != dim:
            raise DimensionMismatch(
                f"model {model!r} holds vectors of dimension {expected}, got one of dimension {dim}",
                model=model,
                expected=expected,
                got=dim,
            )

    async def delete(self, vec_id: str) -> bool:
        """Delete one vector; False when there was none."""
        check_key(vec_id, "vec_id")
        return await self.backend.delete_vector(vec_id)

    async def by_source(self, source_id: str) -> list[Vector]:
        """The source's vectors (every model), by model then id."""
        check_key(source_id, "source_id")
        return await self.backend.vectors_by_source(source_id)

    async def models(self) -> dict[str, int]:
        """Every model of the index with its dimension."""
        return {m.model: m.dim for m in await self.backend.vector_models()}

    # --- searching ---------------------------------------------------------------------------------------

    async def search(
        self,
        query: Embedding,
        k: int = 10,
        *,
        model: str | None = None,
        filter: Mapping[str, Any] | None = None,
    ) -> list[Hit]:
        """The ``k`` vectors most similar to ``query`` (cosine), best first, ties by ``vec_id``.

        ``model`` may be left out when the index holds one model. ``filter`` keeps the vectors whose
        metadata has each of its keys with an equal value. An empty index (or model) gives no hits.
        """
        check_int(k, "k", minimum=1)
        if model is not None:
            check_key(model, "model")
        wanted = _check_metadata(filter)
        _, values = to_float32(query, "query", model=model)
        dims = await self.models()
        if model is None:
            if len(dims) > 1:
                raise InvalidArgument(
                    f"the index holds several models ({', '.join(sorted(dims))}); pass model=",
                    models=sorted(dims),
                )
            model = next(iter(dims), None)
        dim = dims.get(model) if model is not None else None
        if dim is not None and dim != len(values):
            raise DimensionMismatch(
                f"model {model!r} holds vectors of dimension {dim}, the query has {len(values)}",
                model=model,
                expected=dim,
                got=len(values),
            )
        if dim is None:
            return []
        return await self.engine.search(SearchRequest(model, dim, values, k, wanted))

    # --- lag ---------------------------------------------------------------------------------------------

    async def source_changed(self, source_id: str, version: int) -> None:
        """Announce that a source (a document, a file … anything not a memory) is now at ``version``:
        until a vector of that version is stored it is listed by :meth:`lagging`. An older version than
        one announced before is ignored."""
        check_key(source_id, "source_id")
        _check_version(version, "version")
        await self.backend.source_changed(source_id, version, at=dt.datetime.now(dt.UTC))

    async def source_deleted(self, source_id: str) -> None:
        """Announce that a source no longer exists: it stops lagging, and ``store.purge()`` removes its
        vectors once the memories' grace period has passed."""
        check_key(source_id, "source_id")
        await self.backend.sources_gone([source_id], at=dt.datetime.now(dt.UTC))

    async def _sync(self) -> None:
        """Bring the sources table up to date with the memories' changes (a batch per transaction)."""
        start: tuple[dt.datetime, str] | None = None
        while True:
            read, start = await self.backend.sync_vector_sources(
                overlap=CHANGE_OVERLAP, start=start, limit=_SYNC_BATCH
            )
            if read < _SYNC_BATCH:
                return

    async def lagging(self, limit: int = 100) -> list[Lag]:
        """Sources whose vectors are missing or older than the source, the longest lagging first: live
        memories (by ``id`` and ``version``) and sources announced with :meth:`source_changed`."""
        check_int(limit, "limit", minimum=1)
        await self._sync()
        return await self.backend.lagging_sources(limit=limit)

    async def count_lagging(self, *, sync: bool = True) -> int:
        """How many sources lag (``sync=False``: without reading the memories' latest changes first,
        which writes to the sources table)."""
        if sync:
            await self._sync()
        return await self.backend.count_lagging()

    async def rebuild(
        self,
        embed: EmbedFn,
        *,
        model: str,
        batch_size: int = 64,
        text_for: TextFn | None = None,
    ) -> int:
        """Embed every lagging source with ``embed`` and store the vectors under ``model``; returns how
        many sources were embedded.

        ``embed(texts)`` (sync or async) gets up to ``batch_size`` texts — a memory's content (a str as
        is, anything else as its JSON), or ``text_for(source_id)`` for other sources — and returns one
        embedding per text. Each batch is committed on its own: after a crash, calling ``rebuild`` again
        goes on with what still lags. A source's vectors in ``model`` are replaced by one vector (keeping
        the first one's id, else the source id). ``text_for`` returning None, or a memory forgotten or
        superseded since, marks the source gone instead.
        """
        if not callable(embed):
            raise InvalidArgument(f"embed must be callable, got {embed!r}")
        if text_for is not None and not callable(text_for):
            raise InvalidArgument(f"text_for must be callable, got {text_for!r}")
        check_key(model, "model")
        check_int(batch_size, "batch_size", minimum=1)
        done = 0
        after: tuple[dt.datetime, str] | None = None
        while True:
            await self._sync()
            lags = await self.backend.lagging_sources(limit=batch_size, after=after)
            if not lags:
                return done
            after = (lags[-1].changed_at, lags[-1].source_id)
            done += await self._rebuild_batch(lags, embed, model, text_for)

    async def _rebuild_batch(
        self, lags: list[Lag], embed: EmbedFn, model: str, text_for: TextFn | None
    ) -> int:
        texts: list[str] = []
        todo: list[tuple[str, int, dict[str, Any] | None]] = []
        gone: list[str] = []
        for lag in lags:
            if lag.kind == "memory":
                memory = await self.backend.get_memory(lag.source_id)
                if memory is None or memory.forgotten or memory.superseded:
                    gone.append(lag.source_id)
                    continue
                content = memory.content
                text = content if isinstance(content, str) else self.codec.encode(content).decode("utf-8")
                todo.append((lag.source_id, memory.version, {"type": memory.type, "scope": memory.scope}))
                texts.append(text)
                continue
            if text_for is None:
                raise InvalidArgument(
                    f"source {lag.source_id!r} is not a memory: pass text_for=... to rebuild() to give "
                    "its text",
                    source_id=lag.source_id,
                )
            found = text_for(lag.source_id)
            if inspect.isawaitable(found):
                found = await found
            if found is None:
                gone.append(lag.source_id)
                continue
            if not isinstance(found, str):
                raise InvalidArgument(
                    f"text_for({lag.source_id!r}) returned {type(found).__name__}, not a str",
                    source_id=lag.source_id,
                )
            todo.append((lag.source_id, lag.version, None))
            texts.append(found)
        writes: list[VectorWrite] = []
        if texts:
            result = embed(texts)
            if inspect.isawaitable(result):
                result = await result
            embeddings = list(result)
            if len(embeddings) != len(texts):
                raise InvalidArgument(
                    f"embed returned {len(embeddings)} embeddings for {len(texts)} texts; it must return one "
                    "per text, in order"
                )
            for (source_id, version, meta), emb in zip(todo, embeddings, strict=True):
                raw, values = to_float32(emb, f"the embedding of {source_id!r}", model=model)
                self.check_dim(model, len(values))
                writes.append(
                    VectorWrite(
                        vec_id=None,
                        model=model,
                        source_id=source_id,
                        source_version=version,
                        embedding=raw,
                        dim=len(values),
                        metadata=None if meta is None else self.codec.encode(meta),
                    )
                )
        if writes:
            await self._write(writes)
        if gone:
            await self.backend.sources_gone(gone, at=dt.datetime.now(dt.UTC))
        return len(writes)


__all__ = [
    "CHANGE_OVERLAP",
    "ExactSearch",
    "Hit",
    "Lag",
    "SearchEngine",
    "SearchRequest",
    "Vector",
    "VectorIndex",
    "exact_score",
    "to_float32",
]
