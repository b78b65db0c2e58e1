"""LangGraph's long-term memory store on a statekeel store: :class:`StatekeelStore`, a ``BaseStore``.

One line to adopt it (``pip install 'statekeel[langgraph]'``)::

    from statekeel.integrations.langgraph_store import StatekeelStore

    graph = builder.compile(checkpointer=StatekeelSaver(store), store=StatekeelStore(store))

Each item is a statekeel memory (``store.memory``): ``type`` ``semantic`` (or the ``memory_type`` given),
``scope`` ``langgraph/`` followed by the namespace's labels joined by ``.`` (LangGraph forbids ``.`` in a
label), ``key`` the item's key, ``content`` its value. A put of a changed value updates the memory in
place with its history (``memory.history(id)`` lists every value it had); a delete forgets it (soft
delete, history DELETE). With an ``index`` configuration the item's texts are embedded into
``store.vectors`` (one vector per indexed field, model ``langgraph``) and ``search(query=...)`` ranks by
cosine similarity.
"""

from __future__ import annotations

import asyncio
import builtins
import datetime as dt
import itertools
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        IndexConfig,
        InvalidNamespaceError,
        Item,
        ListNamespacesOp,
        MatchCondition,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        TTLConfig,
        ensure_embeddings,
        get_text_at_path,
        tokenize_path,
        validate_op_namespace,
    )
except ImportError as exc:  # an optional extra
    raise ImportError(
        f"statekeel.integrations.langgraph_store needs LangGraph: pip install 'statekeel[langgraph]' ({exc})"
    ) from exc

from ..backends.base import MEMORY_TYPES, Memory, every_item
from ..errors import (
    DimensionMismatch,
    InvalidConfig,
    InvalidEmbedding,
    InvalidKey,
    SerializationError,
    SyncCallRefused,
    UnserializableValue,
)
from ..store import Store, open_store
from ..validation import check_key
from ..vectors import to_float32

SCOPE_PREFIX = "langgraph/"
# Memories (or scopes) read per page by a search without a query or a namespace listing.
_PAGE = 500
# Item metadata kept in the memory's ``data``: LangGraph's update time (a TTL refresh is not an update)
# and the item's TTL in minutes.
_UPDATED = "updated_at"
_TTL = "ttl_minutes"
_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")


def _scope(namespace: tuple[str, ...]) -> str:
    try:
        return check_key(SCOPE_PREFIX + ".".join(namespace), "namespace")
    except InvalidKey as exc:
        raise InvalidConfig(exc.message, namespace=namespace) from None


def _scope_prefix(prefix: tuple[str, ...]) -> str:
    """What the scopes of the namespaces under ``prefix`` start with (and a few more: ``("a",)`` gives
    ``langgraph/a``, the start of ``("ab",)``'s scope too)."""
    return _scope(prefix) if prefix else SCOPE_PREFIX


def _fixed_labels(conditions: Iterable[MatchCondition]) -> tuple[str, ...]:
    """The longest run of labels before a wildcard that a prefix condition fixes."""
    fixed: tuple[str, ...] = ()
    for condition in conditions:
        if condition.match_type == "prefix":
            labels = tuple(itertools.takewhile(lambda label: label != "*", condition.path))
            fixed = max(fixed, labels, key=len)
    return fixed


def _namespace(scope: str) -> tuple[str, ...]:
    return tuple(scope[len(SCOPE_PREFIX) :].split("."))


def _key(key: Any) -> str:
    try:
        return check_key(key, "key")
    except InvalidKey as exc:
        raise InvalidConfig(exc.message, value=key) from None


def _matches(value: Any, wanted: Any) -> bool:
    """Whether an item's value matches a search filter (exact values, nested dicts, ``$`` operators)."""
    if isinstance(wanted, Mapping):
        if any(isinstance(k, str) and k.startswith("$") for k in wanted):
            return all(_compare(value, op, operand) for op, operand in wanted.items())
        return isinstance(value, Mapping) and all(_matches(value.get(k), v) for k, v in wanted.items())
    return bool(value == wanted)


def _compare(value: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return bool(value == operand)
    if op == "$ne":
        return bool(value != operand)
    try:
        if op == "$gt":
            return bool(value > operand)
        if op == "$gte":
            return bool(value >= operand)
        if op == "$lt":
            return bool(value < operand)
        return bool(value <= operand)
    except TypeError:
        return False  # incomparable values (a str against a number) do not match


def _check_filter(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidConfig(f"filter must be a dict, got {type(value).__name__}")

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                if isinstance(k, str) and k.startswith("$") and k not in _OPERATORS:
                    raise InvalidConfig(f"filter operator {k!r} is not one of {', '.join(_OPERATORS)}")
                walk(v)

    walk(value)
    return dict(value)


def _matches_condition(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    pairs = (
        zip(namespace, path, strict=False)
        if condition.match_type == "prefix"
        else zip(reversed(namespace), reversed(path), strict=False)
    )
    return all(p == "*" or n == p for n, p in pairs)


class StatekeelStore(BaseStore):
    """LangGraph's ``BaseStore`` on statekeel memories (and vectors, for semantic search).

    ``StatekeelStore(store, index=None, ttl=None)``: ``index`` is LangGraph's ``IndexConfig`` (``dims``,
    ``embed``: a LangChain ``Embeddings``, a sync or async function of a list of texts, or a provider
    string; ``fields``: the JSON paths to embed, default the whole value); ``ttl`` is LangGraph's
    ``TTLConfig`` (``default_ttl`` in minutes, ``refresh_on_read``). Expired items are never returned;
    ``store.purge()`` deletes them with the other expired memories.

    The async methods (``aget``, ``aput``, ``asearch``, ``adelete``, ``alist_namespaces``, ``abatch``) are
    the interface; the sync ones run on the store's event loop from another thread (on that loop they
    raise :class:`~statekeel.errors.SyncCallRefused`). Ops of a batch run in order.

    Search without a query reads only the items under its namespace prefix, and ``list_namespaces`` only
    the scopes under the labels its prefix condition fixes (both from the memories' scope index: their
    cost grows with what they read, not with the store); ``search(query=...)`` reads the nearest vectors
    first.
    """

    supports_ttl = True

    def __init__(
        self,
        store: Store,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        memory_type: str = "semantic",
        model: str = "langgraph",
    ) -> None:
        if not isinstance(store, Store):
            raise InvalidConfig(f"StatekeelStore needs an open statekeel Store, got {type(store).__name__}")
        if memory_type not in MEMORY_TYPES:
            raise InvalidConfig(f"memory_type must be one of {', '.join(MEMORY_TYPES)}, got {memory_type!r}")
        self.store = store
        self.memory_type = memory_type
        self.model = check_key(model, "model")
        self.ttl_config = ttl
        self.index_config = index
        self._fields: list[tuple[str, list[str]]] = []
        self.embeddings = None
        if index is not None:
            if "embed" not in index or "dims" not in index:
                raise InvalidConfig("index needs 'dims' and 'embed' (an Embeddings or an embedding function)")
            self.embeddings = ensure_embeddings(index["embed"])
            fields = index.get("fields") or ["$"]
            self._fields = [(f, tokenize_path(f) if f != "$" else [f]) for f in fields]
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    @classmethod
    @asynccontextmanager
    async def from_url(
        cls,
        url: str,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        **store_options: Any,
    ) -> AsyncIterator[StatekeelStore]:
        """``async with StatekeelStore.from_url("sqlite:///agent.db") as store:`` opens the statekeel store
        (``open_store`` options as keywords) and closes it at the end of the block."""
        async with open_store(url, **store_options) as opened:
            yield cls(opened, index=index, ttl=ttl)

    # --- batches ------------------------------------------------------------------------------------

    async def abatch(self, ops: Iterable[Op]) -> builtins.list[Result]:
        """Run the ops in order; one result per op (None for a put)."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        ops = builtins.list(ops)
        for op in ops:  # every op is checked before the first one runs
            self._check(op)
        results: builtins.list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(await self._get(op))
            elif isinstance(op, SearchOp):
                results.append(await self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(await self._list_namespaces(op))
            else:
                assert isinstance(op, PutOp)
                await self._put(op)
                results.append(None)
        return results

    def batch(self, ops: Iterable[Op]) -> builtins.list[Result]:
        """:meth:`abatch` from another thread, on the store's event loop."""
        loop = self.loop
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if loop is not None and current is loop:
            raise SyncCallRefused(
                "StatekeelStore.batch() (and get/put/search …) was called on the event loop the store runs "
                "on, where it would block forever",
                hint="Use the async methods there: await store.aget(...), await store.aput(...) …",
            )
        if loop is None or loop.is_closed() or not loop.is_running():
            raise SyncCallRefused(
                "StatekeelStore's sync methods run on the store's event loop, which is not running; call "
                "them from another thread while the loop that made this StatekeelStore runs",
                hint="Make the StatekeelStore in async code, on the loop its statekeel store runs on",
            )
        return asyncio.run_coroutine_threadsafe(self.abatch(ops), loop).result()

    def _check(self, op: Any) -> None:
        if not isinstance(op, GetOp | PutOp | SearchOp | ListNamespacesOp):
            raise InvalidConfig(f"unknown store operation {type(op).__name__}")
        validate_op_namespace(op)
        if isinstance(op, GetOp | PutOp):
            if not op.namespace:
                raise InvalidNamespaceError("Namespace cannot be empty.")
            _scope(op.namespace)
            _key(op.key)
        if isinstance(op, PutOp):
            if op.namespace[0] == "langgraph":
                raise InvalidNamespaceError(
                    f"namespace {op.namespace} starts with 'langgraph', a root label LangGraph reserves"
                )
            if op.value is not None and not isinstance(op.value, dict):
                raise InvalidConfig(f"value must be a dict, got {type(op.value).__name__}")
            if op.ttl is not None and (type(op.ttl) not in (int, float) or not op.ttl > 0):
                raise InvalidConfig(f"ttl must be None or a positive number of minutes, got {op.ttl!r}")
            if op.value is not None:
                try:
                    self.store.codec.encode(op.value, where="value")
                except SerializationError as exc:
                    if type(exc) is not SerializationError:
                        raise
                    raise UnserializableValue(exc.message, path="value") from None
        if isinstance(op, SearchOp | ListNamespacesOp):
            for name, value, low in (("limit", op.limit, 1), ("offset", op.offset, 0)):
                if type(value) is not int or value < low:
                    raise InvalidConfig(f"{name} must be an int >= {low}, got {value!r}")
        if isinstance(op, SearchOp):
            _scope_prefix(tuple(op.namespace_prefix))
            _check_filter(op.filter)
        if isinstance(op, ListNamespacesOp):
            if op.max_depth is not None and (type(op.max_depth) is not int or op.max_depth < 1):
                raise InvalidConfig(f"max_depth must be None or an int >= 1, got {op.max_depth!r}")
            _scope_prefix(_fixed_labels(op.match_conditions or ()))

    # --- operations -----------------------------------------------------------------------------------

    def _item(self, memory: Memory, cls: type[Item] = Item, score: float | None = None) -> Any:
        data = memory.data if isinstance(memory.data, dict) else {}
        updated = data.get(_UPDATED)
        # Taken just before the write, so at most the memory's own creation time on the first put.
        updated_at = (
            max(updated, memory.created_at) if isinstance(updated, dt.datetime) else memory.updated_at
        )
        fields = {
            "namespace": _namespace(memory.scope),
            "key": memory.key,
            "value": memory.content,
            "created_at": memory.created_at,
            "updated_at": updated_at,
        }
        return SearchItem(**fields, score=score) if cls is SearchItem else Item(**fields)

    async def _find(self, namespace: tuple[str, ...], key: str) -> Memory | None:
        page = await self.store.memory.query(self.memory_type, _scope(namespace), key, limit=1)
        return page.items[0] if page.items else None

    async def _refresh(self, memory: Memory) -> None:
        """Push a TTL item's expiry ``ttl`` minutes from now (a read counts as an access)."""
        data = memory.data if isinstance(memory.data, dict) else {}
        minutes = data.get(_TTL)
        if not isinstance(minutes, int | float) or memory.key is None:
            return
        await self.store.memory.put(
            self.memory_type,
            memory.key,
            memory.content,
            scope=memory.scope,
            data=data,
            expires_at=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=minutes),
            reason="langgraph ttl refresh",
        )

    async def _get(self, op: GetOp) -> Item | None:
        memory = await self._find(op.namespace, op.key)
        if memory is None:
            return None
        if op.refresh_ttl:
            await self._refresh(memory)
        item: Item = self._item(memory)
        return item

    async def _put(self, op: PutOp) -> None:
        scope = _scope(op.namespace)
        if op.value is None:
            found = await self._find(op.namespace, op.key)
            if found is not None:
                await self.store.memory.forget(found.id, reason="langgraph delete", actor=None)
            return
        embeddings = self.embeddings
        texts = self._texts(op) if embeddings is not None else []
        # Embedded and checked before the write: an embedder that fails, or returns a vector the index
        # refuses (NaN, infinite, all zeros, another dimension), changes nothing.
        vectors = await embeddings.aembed_documents([t for _, t in texts]) if embeddings and texts else []
        self._check_vectors(texts, vectors)
        now = dt.datetime.now(dt.UTC)
        data: dict[str, Any] = {_UPDATED: now}
        expires_at = None
        if op.ttl is not None:
            data[_TTL] = op.ttl
            expires_at = now + dt.timedelta(minutes=op.ttl)
        # The memory and its vectors commit together: a put is all or nothing.
        async with self.store.backend.atomic():
            try:
                memory = await self.store.memory.put(
                    self.memory_type, op.key, op.value, scope=scope, data=data, expires_at=expires_at
                )
            except InvalidKey as exc:
                raise InvalidConfig(exc.message) from None
            if embeddings is None:
                return
            kept = set()
            for n, ((field, _), vector) in enumerate(zip(texts, vectors, strict=True)):
                vec_id = f"{memory.id}:{n}"
                kept.add(vec_id)
                await self.store.vectors.upsert(
                    vec_id,
                    memory.id,
                    vector,
                    model=self.model,
                    source_version=memory.version,
                    metadata={**_prefixes(op.namespace), "field": field},
                )
            for old in await self.store.vectors.by_source(memory.id):
                if old.model == self.model and old.vec_id not in kept:
                    await self.store.vectors.delete(old.vec_id)

    def _check_vectors(self, texts: builtins.list[tuple[str, str]], vectors: Sequence[Any]) -> None:
        """Refuse, before anything is written, what the embedder returned that the index would not take:
        another number of vectors than texts, or a vector with NaN, infinities, all zeros, or another
        dimension than the index's ``dims`` (or than the model's vectors already stored)."""
        if len(vectors) != len(texts):
            raise InvalidEmbedding(
                f"the embedder returned {len(vectors)} vectors for {len(texts)} texts; nothing was written",
                model=self.model,
            )
        dims = self.index_config["dims"] if self.index_config is not None else None
        for (field, _), vector in zip(texts, vectors, strict=True):
            _, values = to_float32(vector, f"the embedding of field {field!r}", model=self.model)
            if isinstance(dims, int) and len(values) != dims:
                raise DimensionMismatch(
                    f"the embedding of field {field!r} has dimension {len(values)}, but the index was "
                    f"configured with dims={dims}",
                    model=self.model,
                    expected=dims,
                    got=len(values),
                )
            self.store.vectors.check_dim(self.model, len(values))

    def _texts(self, op: PutOp) -> builtins.list[tuple[str, str]]:
        if op.index is False:
            return []
        fields = (
            self._fields
            if op.index is None
            else [(f, tokenize_path(f) if f != "$" else [f]) for f in op.index]
        )
        texts = []
        for field, path in fields:
            for text in get_text_at_path(op.value, path):
                texts.append((field, text))
        return texts

    async def _scan(self, prefix: tuple[str, ...]) -> AsyncIterator[Memory]:
        """The items under the namespace ``prefix``, newest first: the memories whose scope starts with the
        prefix's scope (read from the scope index alone), less those of a longer last label."""
        async for memory in every_item(
            lambda cursor: self.store.memory.query(
                self.memory_type, scope_prefix=_scope_prefix(prefix), limit=_PAGE, cursor=cursor
            )
        ):
            if _namespace(memory.scope)[: len(prefix)] == prefix:
                yield memory

    async def _search(self, op: SearchOp) -> builtins.list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        wanted = _check_filter(op.filter)
        found: builtins.list[tuple[Memory, float | None]] = []
        need = op.offset + op.limit
        if op.query and self.embeddings is not None:
            found = await self._nearest(op.query, prefix, wanted, need)
        else:
            async for memory in self._scan(prefix):
                if wanted is None or _matches(memory.content, wanted):
                    found.append((memory, None))
                    if len(found) >= need:
                        break
        chosen = found[op.offset : need]
        if op.refresh_ttl:
            for memory, _ in chosen:
                await self._refresh(memory)
        return [self._item(memory, SearchItem, score) for memory, score in chosen]

    async def _nearest(
        self, query: str, prefix: tuple[str, ...], wanted: dict[str, Any] | None, need: int
    ) -> builtins.list[tuple[Memory, float | None]]:
        assert self.embeddings is not None
        vector = await self.embeddings.aembed_query(query)
        metadata_filter = {f"p{len(prefix)}": ".".join(prefix)} if prefix else None
        k = max(need * 2, 10)
        while True:
            hits = await self.store.vectors.search(vector, k, model=self.model, filter=metadata_filter)
            best: dict[str, float] = {}
            for hit in hits:  # best first: an item's first hit is its score
                best.setdefault(hit.source_id, hit.score)
            found: builtins.list[tuple[Memory, float | None]] = []
            now = dt.datetime.now(dt.UTC)
            for source_id, score in best.items():
                memory = await self.store.memory.get(source_id)
                if (
                    memory is None
                    or memory.superseded
                    or memory.expired(now)
                    or memory.type != self.memory_type
                    or not memory.scope.startswith(SCOPE_PREFIX)
                    or (wanted is not None and not _matches(memory.content, wanted))
                ):
                    continue
                found.append((memory, score))
                if len(found) >= need:
                    return found
            if len(hits) < k:
                return found
            k *= 4

    async def _list_namespaces(self, op: ListNamespacesOp) -> builtins.list[tuple[str, ...]]:
        conditions = op.match_conditions or ()
        # Only the scopes under the labels a prefix condition fixes are read; the conditions themselves
        # are checked on each namespace.
        prefix = _scope_prefix(_fixed_labels(conditions))
        seen: set[tuple[str, ...]] = set()
        scopes = every_item(
            lambda cursor: self.store.memory.scopes(prefix, type=self.memory_type, limit=_PAGE, cursor=cursor)
        )
        async for scope in scopes:
            namespace = _namespace(scope)
            if all(_matches_condition(c, namespace) for c in conditions):
                seen.add(namespace if op.max_depth is None else namespace[: op.max_depth])
        return sorted(seen)[op.offset : op.offset + op.limit]


def _prefixes(namespace: tuple[str, ...]) -> dict[str, str]:
    """Vector metadata naming each prefix of the namespace (``p1``, ``p2`` …), so that a search under a
    prefix filters the vectors by equality."""
    return {f"p{n}": ".".join(namespace[:n]) for n in range(1, len(namespace) + 1)}


__all__ = ["SCOPE_PREFIX", "StatekeelStore"]
