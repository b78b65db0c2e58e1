"""StatekeelStore, LangGraph's ``BaseStore`` on statekeel memories and vectors, on every backend.

LangGraph ships no conformance suite for stores: these tests follow ``BaseStore``'s documented
behaviour (namespaces, put/get/search/delete, filters, list_namespaces, TTL, semantic search with an
index configuration), then statekeel's: each value's history is kept, and bad input raises before any
write.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any, TypedDict

import pytest

pytest.importorskip("langgraph.store.base")

from langgraph.graph import END, START, StateGraph
from langgraph.store.base import (
    BaseStore,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchItem,
    SearchOp,
)

import statekeel
from statekeel.integrations.langgraph_store import StatekeelStore

WORDS = ("cat", "dog", "pizza", "pasta", "python", "rust")


def embed(texts: list[str]) -> list[list[float]]:
    """A deterministic embedder: how often each word occurs, plus a small constant (never all zeros)."""
    return [[float(t.lower().count(w)) for w in WORDS] + [0.01] for t in texts]


@pytest.fixture
async def lg(store: statekeel.Store) -> StatekeelStore:
    return StatekeelStore(store)  # made on the store's event loop, which its sync methods run on


async def test_put_then_get_returns_the_item(lg: StatekeelStore) -> None:
    await lg.aput(("users", "u1"), "prefs", {"food": "pizza", "n": 1})
    item = await lg.aget(("users", "u1"), "prefs")
    assert item is not None
    assert (item.namespace, item.key, item.value) == (("users", "u1"), "prefs", {"food": "pizza", "n": 1})
    assert item.created_at == item.updated_at
    assert await lg.aget(("users", "u1"), "missing") is None
    assert await lg.aget(("users", "u2"), "prefs") is None


async def test_an_update_keeps_created_at_and_the_history_of_values(
    lg: StatekeelStore, store: statekeel.Store
) -> None:
    await lg.aput(("users", "u1"), "prefs", {"food": "pizza"})
    first = await lg.aget(("users", "u1"), "prefs")
    await lg.aput(("users", "u1"), "prefs", {"food": "pasta"})
    second = await lg.aget(("users", "u1"), "prefs")
    assert first is not None and second is not None
    assert second.value == {"food": "pasta"}
    assert second.created_at == first.created_at and second.updated_at > first.updated_at
    memory = (await store.memory.query("semantic", "langgraph/users.u1", "prefs")).items[0]
    history = await store.memory.history(memory.id)
    assert [(e.event, e.new) for e in history] == [
        ("ADD", {"food": "pizza"}),
        ("UPDATE", {"food": "pasta"}),
    ]


async def test_delete_removes_the_item_and_keeps_its_history(
    lg: StatekeelStore, store: statekeel.Store
) -> None:
    await lg.aput(("users", "u1"), "prefs", {"food": "pizza"})
    memory = (await store.memory.query("semantic", "langgraph/users.u1", "prefs")).items[0]
    await lg.adelete(("users", "u1"), "prefs")
    assert await lg.aget(("users", "u1"), "prefs") is None
    assert await lg.asearch(("users",)) == []
    assert [e.event for e in await store.memory.history(memory.id)] == ["ADD", "DELETE"]
    await lg.adelete(("users", "u1"), "prefs")  # deleting what is not there is not an error


async def test_search_by_prefix_filter_limit_and_offset(lg: StatekeelStore) -> None:
    for n in range(6):
        await lg.aput(
            ("docs", "u1" if n % 2 else "u2"), f"d{n}", {"n": n, "kind": "report" if n < 4 else "memo"}
        )
    await lg.aput(("other",), "x", {"n": 100, "kind": "report"})
    found = await lg.asearch(("docs",), limit=10)
    assert sorted(i.key for i in found) == [f"d{n}" for n in range(6)]
    assert all(isinstance(i, SearchItem) and i.score is None for i in found)
    assert sorted(i.key for i in await lg.asearch(("docs", "u1"))) == ["d1", "d3", "d5"]
    assert sorted(i.key for i in await lg.asearch(("docs",), filter={"kind": "report"})) == [
        "d0", "d1", "d2", "d3",
    ]  # fmt: skip
    assert sorted(i.key for i in await lg.asearch(("docs",), filter={"n": {"$gte": 2, "$lt": 5}})) == [
        "d2", "d3", "d4",
    ]  # fmt: skip
    assert sorted(i.key for i in await lg.asearch(("docs",), filter={"kind": {"$ne": "report"}})) == [
        "d4", "d5",
    ]  # fmt: skip
    page1 = await lg.asearch(("docs",), limit=4)
    page2 = await lg.asearch(("docs",), limit=4, offset=4)
    assert len(page1) == 4 and len(page2) == 2
    assert {i.key for i in page1} | {i.key for i in page2} == {f"d{n}" for n in range(6)}
    assert len(await lg.asearch((), limit=100)) == 7


async def test_list_namespaces_with_prefix_suffix_depth_and_paging(lg: StatekeelStore) -> None:
    for ns in [("a", "b", "c"), ("a", "b", "d"), ("a", "e"), ("x", "b", "c")]:
        await lg.aput(ns, "k", {"v": 1})
    assert await lg.alist_namespaces() == [("a", "b", "c"), ("a", "b", "d"), ("a", "e"), ("x", "b", "c")]
    assert await lg.alist_namespaces(prefix=("a",)) == [("a", "b", "c"), ("a", "b", "d"), ("a", "e")]
    assert await lg.alist_namespaces(suffix=("c",)) == [("a", "b", "c"), ("x", "b", "c")]
    assert await lg.alist_namespaces(prefix=("*", "b")) == [("a", "b", "c"), ("a", "b", "d"), ("x", "b", "c")]
    assert await lg.alist_namespaces(max_depth=2) == [("a", "b"), ("a", "e"), ("x", "b")]
    assert await lg.alist_namespaces(limit=2, offset=1) == [("a", "b", "d"), ("a", "e")]


async def test_a_namespace_prefix_matches_whole_labels_only(
    lg: StatekeelStore, store: statekeel.Store
) -> None:
    for ns in [("a",), ("a", "b"), ("a-x",), ("ab",), ("ab", "b"), ("a", "c", "b")]:
        await lg.aput(ns, "k", {"ns": list(ns)})
    await store.memory.put("semantic", "k", "not an item", scope="langgraph")
    await store.memory.put("semantic", "k", "not an item", scope="a")
    assert sorted(i.namespace for i in await lg.asearch(("a",))) == [("a",), ("a", "b"), ("a", "c", "b")]
    assert [i.namespace for i in await lg.asearch(("ab",))] == [("ab", "b"), ("ab",)]
    # Sorted as tuples of labels, not as the scopes' text ("a.b" comes after "a-x" there).
    assert await lg.alist_namespaces(prefix=("a",)) == [("a",), ("a", "b"), ("a", "c", "b")]
    assert await lg.alist_namespaces(prefix=("a", "*", "b")) == [("a", "c", "b")]
    assert await lg.alist_namespaces(suffix=("b",)) == [("a", "b"), ("a", "c", "b"), ("ab", "b")]
    assert await lg.alist_namespaces(max_depth=1) == [("a",), ("a-x",), ("ab",)]
    assert await lg.alist_namespaces(limit=2, offset=2) == [("a", "c", "b"), ("a-x",)]


async def test_semantic_search_ranks_by_similarity(store: statekeel.Store) -> None:
    lg = StatekeelStore(store, index={"dims": len(WORDS) + 1, "embed": embed, "fields": ["text"]})
    await lg.aput(("notes", "u1"), "pets", {"text": "my cat and my dog"})
    await lg.aput(("notes", "u1"), "food", {"text": "pizza pizza pasta"})
    await lg.aput(("notes", "u2"), "code", {"text": "python and rust"})
    await lg.aput(("notes", "u2"), "raw", {"text": "pizza"}, index=False)
    hits = await lg.asearch(("notes",), query="I want pizza")
    assert hits[0].key == "food" and hits[0].score is not None
    assert [h.score for h in hits] == sorted([h.score for h in hits], reverse=True)  # type: ignore[type-var]
    assert "raw" not in [h.key for h in hits]  # index=False: not embedded
    assert [h.key for h in await lg.asearch(("notes", "u2"), query="pizza")] == ["code"]
    assert [h.key for h in await lg.asearch(("notes",), query="python", limit=1)] == ["code"]
    await lg.aput(("notes", "u1"), "food", {"text": "rust rust"})  # re-embedded on update
    assert (await lg.asearch(("notes", "u1"), query="rust", limit=1))[0].key == "food"
    await lg.adelete(("notes", "u1"), "food")
    assert "food" not in [h.key for h in await lg.asearch(("notes",), query="rust")]


async def test_ttl_sets_an_expiry_refreshed_by_reads_and_expired_items_are_gone(
    store: statekeel.Store,
) -> None:
    lg = StatekeelStore(store, ttl={"default_ttl": 60, "refresh_on_read": True})
    await lg.aput(("s",), "k", {"v": 1})  # the default TTL
    first = (await store.memory.query("semantic", "langgraph/s", "k")).items[0]
    assert first.expires_at is not None
    assert dt.timedelta(minutes=59) < first.expires_at - first.created_at <= dt.timedelta(minutes=60)
    await lg.aget(("s",), "k")
    refreshed = (await store.memory.query("semantic", "langgraph/s", "k")).items[0]
    assert refreshed.expires_at is not None and refreshed.expires_at > first.expires_at
    await lg.aget(("s",), "k", refresh_ttl=False)
    assert (await store.memory.query("semantic", "langgraph/s", "k")).items[
        0
    ].expires_at == refreshed.expires_at
    await lg.aput(("s",), "brief", {"v": 2}, ttl=0.0001)  # 6 ms
    await asyncio.sleep(0.05)
    assert await lg.aget(("s",), "brief") is None
    assert [i.key for i in await lg.asearch(("s",))] == ["k"]
    await lg.aput(("s",), "forever", {"v": 3}, ttl=None)
    assert (await store.memory.query("semantic", "langgraph/s", "forever")).items[0].expires_at is None


async def test_sync_methods_run_from_another_thread_and_refuse_the_loop(lg: StatekeelStore) -> None:
    await asyncio.to_thread(lg.put, ("t",), "k", {"v": 1})
    item = await asyncio.to_thread(lg.get, ("t",), "k")
    assert item is not None and item.value == {"v": 1}
    with pytest.raises(statekeel.SyncCallRefused):
        lg.get(("t",), "k")


class State(TypedDict):
    user: str
    seen: int


async def test_a_graph_node_reads_and_writes_the_store(lg: StatekeelStore) -> None:
    async def remember(state: State, *, store: BaseStore) -> dict[str, Any]:
        ns = ("visits", state["user"])
        found = await store.aget(ns, "count")
        count = (found.value["n"] if found else 0) + 1
        await store.aput(ns, "count", {"n": count})
        return {"seen": count}

    builder = StateGraph(State)
    builder.add_node("remember", remember)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", END)
    graph = builder.compile(store=lg)
    assert (await graph.ainvoke({"user": "u1", "seen": 0}))["seen"] == 1
    assert (await graph.ainvoke({"user": "u1", "seen": 0}))["seen"] == 2
    assert (await lg.aget(("visits", "u1"), "count")).value == {"n": 2}  # type: ignore[union-attr]


# --- bad input: typed errors, nothing written --------------------------------------------------------


@pytest.mark.parametrize(
    ("namespace", "key", "value", "error", "message"),
    [
        (("a",), "k", ["not", "a", "dict"], statekeel.InvalidConfig, "value must be a dict"),
        (("a",), "k", {"s": {1, 2}}, statekeel.UnserializableValue, "value"),
        (("a",), "", {"v": 1}, statekeel.InvalidConfig, "key is empty"),
        (("a.b",), "k", {"v": 1}, InvalidNamespaceError, "periods"),
        ((), "k", {"v": 1}, InvalidNamespaceError, "empty"),
        (("langgraph",), "k", {"v": 1}, InvalidNamespaceError, "langgraph"),
    ],
)
async def test_bad_puts_are_value_errors_and_write_nothing(
    lg: StatekeelStore,
    store: statekeel.Store,
    namespace: tuple[str, ...],
    key: str,
    value: Any,
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error, match=message) as caught:
        await lg.abatch([PutOp(("ok",), "first", {"v": 0}), PutOp(namespace, key, value)])
    assert isinstance(caught.value, ValueError)
    assert (await store.memory.query()).items == []  # not even the batch's first, valid put


async def test_a_bad_filter_or_paging_is_a_value_error(lg: StatekeelStore) -> None:
    with pytest.raises(statekeel.InvalidConfig, match=r"\$like"):
        await lg.asearch(("a",), filter={"n": {"$like": 1}})
    with pytest.raises(statekeel.InvalidConfig, match="limit"):
        await lg.asearch(("a",), limit=0)
    with pytest.raises(statekeel.InvalidConfig, match="max_depth"):
        await lg.alist_namespaces(max_depth=0)


async def test_a_namespace_prefix_no_scope_can_hold_is_refused_before_the_batch_runs(
    lg: StatekeelStore, store: statekeel.Store
) -> None:
    too_long = ("x" * 600,)
    for op in (
        SearchOp(too_long),
        ListNamespacesOp(match_conditions=(MatchCondition("prefix", (*too_long, "*")),)),
    ):
        with pytest.raises(statekeel.InvalidConfig, match="namespace"):
            await lg.abatch([PutOp(("ok",), "first", {"v": 0}), op])
    assert (await store.memory.query()).items == []


async def test_a_bad_configuration_is_a_value_error(store: statekeel.Store) -> None:
    with pytest.raises(statekeel.InvalidConfig, match="memory_type must be one of"):
        StatekeelStore(store, memory_type="notes")
    with pytest.raises(statekeel.InvalidConfig, match="index needs 'dims' and 'embed'"):
        StatekeelStore(store, index={"dims": 3})  # type: ignore[typeddict-item]
    with pytest.raises(statekeel.InvalidConfig, match="needs an open statekeel Store"):
        StatekeelStore("sqlite:///agent.db")  # type: ignore[arg-type]


def _returning(vector: list[float], *, count: int | None = None) -> Any:
    """An embedder that returns ``vector`` for every text (``count`` vectors, when given)."""

    def embedder(texts: list[str]) -> list[list[float]]:
        return [vector] * (len(texts) if count is None else count)

    return embedder


DIMS = len(WORDS) + 1


@pytest.mark.parametrize(
    ("vector", "count", "error", "message"),
    [
        ([0.0] * DIMS, None, statekeel.InvalidEmbedding, "all zeros"),
        ([float("nan")] + [1.0] * (DIMS - 1), None, statekeel.InvalidEmbedding, "nan"),
        ([1.0] * (DIMS + 1), None, statekeel.DimensionMismatch, f"dims={DIMS}"),
        ([1.0] * DIMS, 2, statekeel.InvalidEmbedding, "2 vectors for 1 texts"),
    ],
    ids=["zero", "nan", "dimension", "count"],
)
async def test_a_put_whose_embedding_is_refused_writes_neither_the_value_nor_a_vector(
    store: statekeel.Store, vector: list[float], count: int | None, error: type[Exception], message: str
) -> None:
    good = StatekeelStore(store, index={"dims": DIMS, "embed": embed, "fields": ["text"]})
    await good.aput(("notes",), "kept", {"text": "my cat"})
    before = await good.aget(("notes",), "kept")
    vectors_before = await store.backend.count_rows("vectors")
    bad = StatekeelStore(
        store, index={"dims": DIMS, "embed": _returning(vector, count=count), "fields": ["text"]}
    )
    for key in ("new", "kept"):  # a new item, and an update of a stored one
        with pytest.raises(error, match=message) as caught:
            await bad.aput(("notes",), key, {"text": "pizza"})
        assert "othing was written" in str(caught.value)  # and it is true:
        assert await store.backend.count_rows("vectors") == vectors_before
    assert await good.aget(("notes",), "new") is None
    after = await good.aget(("notes",), "kept")
    assert after is not None and before is not None
    assert (after.value, after.updated_at) == (before.value, before.updated_at)
    assert [h.key for h in await good.asearch(("notes",), query="cat")] == ["kept"]


async def test_a_put_whose_vector_write_fails_leaves_no_memory_behind(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    lg = StatekeelStore(store, index={"dims": DIMS, "embed": embed, "fields": ["text"]})
    await lg.aput(("notes",), "kept", {"text": "my cat"})

    async def unavailable(*args: Any, **kwargs: Any) -> None:
        raise statekeel.BackendUnavailable("the vector write failed")

    monkeypatch.setattr(store.vectors, "upsert", unavailable)
    for key in ("new", "kept"):
        with pytest.raises(statekeel.BackendUnavailable):
            await lg.aput(("notes",), key, {"text": "pizza pasta"})
    monkeypatch.undo()
    assert await lg.aget(("notes",), "new") is None  # the memory went with its vectors
    kept = await lg.aget(("notes",), "kept")
    assert kept is not None and kept.value == {"text": "my cat"}
    assert [m.key for m in (await store.memory.query()).items] == ["kept"]
    history = await store.memory.history((await store.memory.query()).items[0].id)
    assert len(history) == 1  # no UPDATE event of the rolled back put either
