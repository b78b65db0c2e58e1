"""Vectors, the derived tier, on every backend: float32 embeddings by source, exact cosine search with the
same answers on the numpy and the pure-Python path, lag reported by ``lagging()`` and closed by
``rebuild()``, and bad input refused before anything is written."""

from __future__ import annotations

import math
import random
import struct
from typing import Any

import numpy as np
import pytest

import statekeel
from statekeel.vectors import ExactSearch, SearchRequest


def f32(values: list[float]) -> tuple[float, ...]:
    """The values as float32 would hold them."""
    return struct.unpack(f"<{len(values)}f", struct.pack(f"<{len(values)}f", *values))


async def rows(store: statekeel.Store) -> dict[str, int]:
    return {t: await store.backend.count_rows(t) for t in ("vectors", "vector_models", "vector_sources")}


def embedder(dim: int = 4) -> Any:
    """A small deterministic embedder: the text's length and letter counts."""

    def embed(texts: list[str]) -> list[list[float]]:
        return [[len(t) + 1.0] + [float(t.count(c)) for c in "aeiou"[: dim - 1]] for t in texts]

    return embed


async def test_upsert_stores_float32_values_and_metadata_by_source(store: statekeel.Store) -> None:
    await store.vectors.upsert("v1", "doc-1", [0.1, 0.2, 0.3], model="m", metadata={"lang": "en"})
    await store.vectors.upsert("v2", "doc-1", np.array([1.0, 2.0, 3.0]), model="m", source_version=4)
    found = await store.vectors.by_source("doc-1")
    assert [v.vec_id for v in found] == ["v1", "v2"]
    assert found[0].embedding == f32([0.1, 0.2, 0.3]) and found[0].metadata == {"lang": "en"}
    assert found[1].source_version == 4 and found[1].dim == 3 and found[1].metadata == {}
    # A replace keeps the stored metadata unless new metadata is given.
    await store.vectors.upsert("v1", "doc-1", [0.3, 0.2, 0.1], model="m")
    again = await store.vectors.by_source("doc-1")
    assert again[0].embedding == f32([0.3, 0.2, 0.1]) and again[0].metadata == {"lang": "en"}
    assert await store.vectors.delete("v1") is True
    assert await store.vectors.delete("v1") is False
    assert [v.vec_id for v in await store.vectors.by_source("doc-1")] == ["v2"]
    assert await store.vectors.models() == {"m": 3}


async def test_search_ranks_by_cosine_with_ties_by_vec_id_and_filters_on_metadata(
    store: statekeel.Store,
) -> None:
    v = store.vectors
    await v.upsert("c", "s-c", [1, 0], model="m", metadata={"kind": "x"})
    await v.upsert("a", "s-a", [2, 0], model="m", metadata={"kind": "y"})  # same direction as "c": a tie
    await v.upsert("b", "s-b", [1, 1], model="m", metadata={"kind": "x"})
    await v.upsert("d", "s-d", [-1, 0], model="m", metadata={"kind": "x"})
    hits = await v.search([1, 0], k=3)
    assert [h.vec_id for h in hits] == ["a", "c", "b"]
    assert hits[0].score == hits[1].score == 1.0
    assert math.isclose(hits[2].score, 1 / math.sqrt(2))
    assert hits[0].source_id == "s-a" and hits[0].metadata == {"kind": "y"}
    assert [h.vec_id for h in await v.search([1, 0], k=10, filter={"kind": "x"})] == ["c", "b", "d"]
    assert await v.search([1, 0], filter={"kind": "z"}) == []
    assert await v.search([1, 0], model="other") == []


async def test_search_sees_upserts_and_deletes_made_after_it_cached_the_model(store: statekeel.Store) -> None:
    v = store.vectors
    for i in range(50):
        await v.upsert(f"v{i:02d}", f"s{i}", [1.0, float(i)], model="m")
    assert (await v.search([0, 1], k=1))[0].vec_id == "v49"
    await v.upsert("best", "s-best", [0, 1], model="m")
    assert (await v.search([0, 1], k=1))[0].vec_id == "best"
    await v.upsert("v49", "s49", [1, 0], model="m")  # replaced in place
    assert [h.vec_id for h in await v.search([1, 0], k=2)] == ["v00", "v49"]
    await v.delete("best")
    assert (await v.search([0, 1], k=1))[0].vec_id == "v48"


def _dataset(rng: random.Random, n: int, dim: int) -> list[list[float]]:
    vectors = [[rng.gauss(0, 1) for _ in range(dim)] for _ in range(n)]
    # Exact ties: duplicates, scaled copies, and vectors equally far from the query's axis.
    vectors += [list(vectors[0]), [2 * x for x in vectors[0]], list(vectors[1])]
    vectors += [[1.0] + [0.0] * (dim - 1), [1.0, 1.0] + [0.0] * (dim - 2), [1.0, -1.0] + [0.0] * (dim - 2)]
    # Tiny and huge magnitudes (float32 handles them only in a wide type).
    vectors += [[1e-30 * x for x in vectors[2]], [1e30 * x for x in vectors[3]]]
    return vectors


async def test_numpy_and_pure_python_paths_return_the_same_hits_and_scores(store: statekeel.Store) -> None:
    rng = random.Random(7)
    dim = 24
    data = _dataset(rng, 300, dim)
    for i, emb in enumerate(data):
        await store.vectors.upsert(f"v{i:03d}", f"s{i % 40}", emb, model="m", metadata={"g": i % 3})
    fast = ExactSearch(store.backend, use_numpy=True)
    slow = ExactSearch(store.backend, use_numpy=False)
    queries = [
        data[0],
        data[4],
        [1.0] + [0.0] * (dim - 1),
        *([rng.gauss(0, 1) for _ in range(dim)] for _ in range(8)),
    ]
    for q in queries:
        values = f32(q)
        for k in (1, 3, 10, 400):
            for wanted in (None, {"g": 1}):
                request = SearchRequest("m", dim, values, k, wanted)
                by_numpy, by_python = await fast.search(request), await slow.search(request)
                assert by_numpy == by_python
                assert len(by_numpy) == min(k, len(data) if wanted is None else len(data[1::3]))
    # Duplicates tie exactly and are ordered by id.
    top = await slow.search(SearchRequest("m", dim, f32(data[0]), 3, None))
    assert [h.vec_id for h in top] == ["v000", "v300", "v301"] and top[0].score == top[2].score


async def test_numpy_path_stays_exact_when_many_vectors_are_near_ties(store: statekeel.Store) -> None:
    # Vectors differing in the last float32 bit: the float32 product cannot rank them, the exact pass must.
    base = [0.5, 0.25, 0.125, 1.0]
    writes = []
    for i in range(64):
        emb = list(base)
        emb[3] = float(np.nextafter(np.float32(1.0), np.float32(2.0), dtype=np.float32)) if i % 2 else 1.0
        emb[0] = float(np.float32(0.5) + np.float32(i) * np.float32(2**-24))
        writes.append(emb)
    for i, emb in enumerate(writes):
        await store.vectors.upsert(f"n{i:02d}", "s", emb, model="m")
    request = SearchRequest("m", 4, f32([0.5, 0.25, 0.125, 1.0]), 5, None)
    assert await ExactSearch(store.backend, use_numpy=True).search(request) == await ExactSearch(
        store.backend, use_numpy=False
    ).search(request)


async def test_a_memory_lags_until_a_vector_of_its_version_is_stored(store: statekeel.Store) -> None:
    m = await store.memory.put("user", "drink", "tea", scope="u1")
    [lag] = await store.vectors.lagging()
    assert (lag.source_id, lag.kind, lag.version, lag.indexed_version) == (m.id, "memory", 1, None)
    await store.vectors.upsert("v", m.id, [1, 2], model="m", source_version=m.version)
    assert await store.vectors.lagging() == []
    m2 = await store.memory.put("user", "drink", "coffee", scope="u1")
    assert m2.id == m.id and m2.version == 2
    [lag] = await store.vectors.lagging()
    assert (lag.version, lag.indexed_version) == (2, 1)
    assert (await store.recover()).lagging_vectors == 1
    # A forgotten memory is not embedded again: it no longer lags.
    await store.memory.forget(m.id, reason="asked", actor="u1")
    assert await store.vectors.lagging() == []


async def test_an_announced_source_lags_until_its_version_is_embedded(store: statekeel.Store) -> None:
    v = store.vectors
    await v.source_changed("doc-1", 1)
    await v.source_changed("doc-2", 5)
    assert [(lag.source_id, lag.kind, lag.version) for lag in await v.lagging()] == [
        ("doc-1", "external", 1),
        ("doc-2", "external", 5),
    ]
    await v.upsert("d1", "doc-1", [1, 0], model="m", source_version=1)
    await v.source_changed("doc-2", 3)  # older than announced: ignored
    assert [(lag.source_id, lag.version) for lag in await v.lagging()] == [("doc-2", 5)]
    await v.upsert("d2", "doc-2", [0, 1], model="m")  # no version: still lagging
    assert [lag.source_id for lag in await v.lagging(limit=1)] == ["doc-2"]
    await v.source_deleted("doc-2")
    assert await v.lagging() == []
    assert await v.count_lagging() == 0


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync-embed", "async-embed"])
async def test_rebuild_embeds_every_lagging_source_in_batches_and_closes_the_lag(
    store: statekeel.Store, asynchronous: bool
) -> None:
    memories = [await store.memory.put("semantic", f"k{i}", f"fact number {i} about tea") for i in range(7)]
    await store.memory.put("semantic", None, {"structured": [1, 2]})  # content that is not a str
    await store.vectors.source_changed("doc", 2)
    await store.vectors.upsert("old", memories[0].id, [9, 9, 9, 9], model="m", source_version=0)
    batches: list[int] = []
    sync_embed = embedder()

    def embed(texts: list[str]) -> list[list[float]]:
        batches.append(len(texts))
        return sync_embed(texts)

    async def aembed(texts: list[str]) -> list[list[float]]:
        return embed(texts)

    n = await store.vectors.rebuild(
        aembed if asynchronous else embed, model="m", batch_size=3, text_for=lambda s: f"text of {s}"
    )
    assert n == 9 and batches == [3, 3, 3]
    assert await store.vectors.lagging() == []
    assert await store.vectors.rebuild(embed, model="m") == 0
    # The source's vector was replaced in place (its id kept), with the memory's version.
    [vec] = await store.vectors.by_source(memories[0].id)
    assert vec.vec_id == "old" and vec.source_version == 1
    assert vec.embedding == f32(sync_embed(["fact number 0 about tea"])[0])
    [doc] = await store.vectors.by_source("doc")
    assert doc.vec_id == "doc" and doc.source_version == 2
    # New vectors of memories carry their type and scope (a reused one kept its own metadata).
    query = sync_embed(["fact number 3 about tea"])[0]
    hits = await store.vectors.search(query, k=10, filter={"scope": "global", "type": "semantic"})
    assert len(hits) == 7 and {m.id for m in memories[1:]} <= {h.source_id for h in hits}


async def test_rebuild_marks_gone_what_text_for_no_longer_finds(store: statekeel.Store) -> None:
    await store.vectors.source_changed("gone-doc", 1)
    await store.vectors.source_changed("kept-doc", 1)
    n = await store.vectors.rebuild(
        embedder(), model="m", text_for=lambda s: None if s == "gone-doc" else "some text"
    )
    assert n == 1 and await store.vectors.lagging() == []
    assert await store.vectors.by_source("gone-doc") == []


async def test_rebuild_refuses_a_wrong_embedder_before_writing(store: statekeel.Store) -> None:
    await store.memory.put("user", "a", "alpha")
    await store.memory.put("user", "b", "beta")
    before = await rows(store)
    with pytest.raises(statekeel.InvalidArgument, match="2 texts"):
        await store.vectors.rebuild(lambda texts: [[1.0]], model="m")
    with pytest.raises(statekeel.InvalidEmbedding):
        await store.vectors.rebuild(lambda texts: [[1.0, math.nan]] * len(texts), model="m")
    with pytest.raises(statekeel.InvalidArgument, match="text_for"):
        await store.vectors.source_changed("doc", 1)
        await store.vectors.rebuild(embedder(), model="m", batch_size=10)
    assert {t: n for t, n in (await rows(store)).items() if t != "vector_sources"} == {
        t: n for t, n in before.items() if t != "vector_sources"
    }
    assert len(await store.vectors.lagging()) == 3


async def test_a_memory_put_never_touches_vectors(store: statekeel.Store, monkeypatch: Any) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a memory write reached the vector index")

    for name in ("upsert_vectors", "sync_vector_sources", "source_changed", "sources_gone", "delete_vector"):
        monkeypatch.setattr(store.backend, name, refuse)
    m = await store.memory.put("user", "k", "v")
    await store.memory.put("user", "k", "v2")
    await store.memory.forget(m.id, reason="r", actor="a")
    monkeypatch.undo()
    assert (await store.memory.get(m.id, include_forgotten=True)) is not None


# --- bad input: typed errors, nothing written ------------------------------------------------------------


async def test_an_embedding_of_another_dimension_is_refused_and_nothing_is_written(
    store: statekeel.Store,
) -> None:
    await store.vectors.upsert("v1", "s", [1, 2, 3], model="m")
    before = await rows(store)
    with pytest.raises(statekeel.DimensionMismatch) as info:
        await store.vectors.upsert("v2", "s", [1, 2], model="m")
    assert (info.value.model, info.value.expected, info.value.got) == ("m", 3, 2)
    # Also when this process never saw the model (another process fixed its dimension).
    other = statekeel.VectorIndex(store.backend, store.codec)
    with pytest.raises(statekeel.DimensionMismatch):
        await other.upsert("v3", "s", [1, 2, 3, 4], model="m")
    with pytest.raises(statekeel.DimensionMismatch):
        await store.vectors.search([1, 2], model="m")
    assert await rows(store) == before
    await store.vectors.upsert("v4", "s", [1, 2], model="other")  # another model, another dimension
    assert await store.vectors.models() == {"m": 3, "other": 2}


BAD_EMBEDDINGS: list[Any] = [
    [1.0, math.nan],
    [math.inf, 1.0],
    [1.0, -math.inf],
    [1e39, 1.0],  # finite, but infinite as float32
    [0.0, 0.0],
    [],
    ["1", 2.0],
    [True, 1.0],
    "12",
    {"a": 1.0},
    np.array([[1.0, 2.0]]),
    np.array([1.0, np.nan]),
]


@pytest.mark.parametrize("embedding", BAD_EMBEDDINGS, ids=range(len(BAD_EMBEDDINGS)))
async def test_a_bad_embedding_or_query_is_invalid_embedding_and_nothing_is_written(
    store: statekeel.Store, embedding: Any
) -> None:
    await store.vectors.upsert("ok", "s", [1.0, 2.0], model="m")
    before = await rows(store)
    with pytest.raises(statekeel.InvalidEmbedding):
        await store.vectors.upsert("v", "s", embedding, model="m")
    with pytest.raises(statekeel.InvalidEmbedding):
        await store.vectors.search(embedding, model="m")
    assert await rows(store) == before
    assert [h.vec_id for h in await store.vectors.search([1.0, 2.0])] == ["ok"]


@pytest.mark.parametrize("k", [0, -1, 1.5, None, True])
async def test_k_below_one_or_not_an_int_is_refused(store: statekeel.Store, k: Any) -> None:
    await store.vectors.upsert("ok", "s", [1.0, 2.0], model="m")
    with pytest.raises(statekeel.InvalidArgument):
        await store.vectors.search([1.0, 2.0], k=k)


async def test_other_bad_arguments_are_refused_before_anything_is_written(store: statekeel.Store) -> None:
    v = store.vectors
    await v.upsert("ok", "s", [1.0, 2.0], model="m")
    await v.upsert("other-model", "s", [1.0, 2.0, 3.0], model="m2")
    before = await rows(store)
    for call in (
        v.upsert("", "s", [1.0, 2.0], model="m"),
        v.upsert("v", "", [1.0, 2.0], model="m"),
        v.upsert("v", "s", [1.0, 2.0], model=""),
        v.upsert("v", "s", [1.0, 2.0], model="m", source_version=-1),
        v.upsert("v", "s", [1.0, 2.0], model="m", metadata=["not", "a", "dict"]),
        v.upsert("v", "s", [1.0, 2.0], model="m", metadata={"x": {1, 2}}),
        v.upsert("other-model", "s", [1.0, 2.0], model="m"),  # the id belongs to m2
        v.search([1.0, 2.0]),  # two models: which one?
        v.source_changed("doc", -1),
        v.lagging(limit=0),
        v.rebuild(embedder(), model="m", batch_size=0),
    ):
        with pytest.raises(statekeel.InvalidArgument):
            await call
    assert await rows(store) == before


async def test_copy_store_copies_vectors_and_their_sources(store: statekeel.Store) -> None:
    m = await store.memory.put("user", "k", "v")
    await store.vectors.upsert("v", m.id, [1.0, 2.0], model="m", source_version=1, metadata={"a": [1]})
    await store.vectors.source_changed("doc", 3)
    assert len(await store.vectors.lagging()) == 1
    async with statekeel.open_store("memory://") as copy:
        report = await statekeel.copy_store(store, copy)
        assert report.verified
        assert await copy.vectors.by_source(m.id) == await store.vectors.by_source(m.id)
        assert await copy.vectors.search([1, 2]) == await store.vectors.search([1, 2])
        assert await copy.vectors.lagging() == await store.vectors.lagging()
