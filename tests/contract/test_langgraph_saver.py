"""StatekeelSaver, LangGraph's checkpointer on a statekeel store, on every backend.

LangGraph's own conformance suite (``langgraph-checkpoint-conformance``) runs here test by test, then our
guarantees on top of it: channel values stored once per version, paging, pruning that reclaims space, one
transaction per put, and typed errors before any write.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.conformance.spec import (
    test_copy_thread,
    test_delete_for_runs,
    test_delete_thread,
    test_get_tuple,
    test_list,
    test_prune,
    test_put,
    test_put_writes,
)
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

import statekeel
from statekeel.integrations.langgraph import StatekeelSaver

SPEC: list[tuple[str, Callable[[BaseCheckpointSaver[Any]], Awaitable[None]]]] = [
    (cap, fn)
    for cap, tests in (
        ("put", test_put.ALL_PUT_TESTS),
        ("put_writes", test_put_writes.ALL_PUT_WRITES_TESTS),
        ("get_tuple", test_get_tuple.ALL_GET_TUPLE_TESTS),
        ("list", test_list.ALL_LIST_TESTS),
        ("delete_thread", test_delete_thread.ALL_DELETE_THREAD_TESTS),
        ("delete_for_runs", test_delete_for_runs.ALL_DELETE_FOR_RUNS_TESTS),
        ("copy_thread", test_copy_thread.ALL_COPY_THREAD_TESTS),
        ("prune", test_prune.ALL_PRUNE_TESTS),
    )
    for fn in tests
]
TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


@pytest.fixture
def saver(store: statekeel.Store) -> StatekeelSaver:
    return StatekeelSaver(store)


async def _rows(store: statekeel.Store) -> dict[str, int]:
    return {t: await store.backend.count_rows(t) for t in TABLES}


async def _put(
    saver: StatekeelSaver,
    thread: str,
    values: dict[str, Any],
    versions: dict[str, Any],
    new_versions: dict[str, Any],
    *,
    parent: dict[str, Any] | None = None,
    ns: str = "",
    **metadata: Any,
) -> dict[str, Any]:
    config = generate_config(thread, checkpoint_ns=ns)
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    cp = generate_checkpoint(channel_values=values, channel_versions=versions)
    return dict(await saver.aput(config, cp, generate_metadata(**metadata), new_versions))


async def _all(saver: StatekeelSaver, config: Any, **kwargs: Any) -> list[Any]:
    return [t async for t in saver.alist(config, **kwargs)]


# --- LangGraph's conformance suite -----------------------------------------------------------------------


@pytest.mark.parametrize(("capability", "spec"), SPEC, ids=[f"{c}-{f.__name__}" for c, f in SPEC])
async def test_conformance_spec(saver: StatekeelSaver, capability: str, spec: Any) -> None:
    await spec(saver)


async def test_conformance_report_is_full_with_every_capability_detected(store: statekeel.Store) -> None:
    @checkpointer_test(name=f"statekeel-{store.url.split(':')[0]}")
    async def registered() -> AsyncIterator[StatekeelSaver]:
        yield StatekeelSaver(store)

    report = await validate(registered)
    failures = {cap: r.failures for cap, r in report.results.items() if r.passed is not True}
    assert failures == {}
    assert {cap for cap, r in report.results.items() if r.detected} == {c.value for c in ALL_CAPABILITIES}
    assert report.conformance_level() == "FULL"


# --- storage: what changed is stored, once -----------------------------------------------------------------


async def test_unchanged_channel_is_stored_once_across_many_checkpoints(
    saver: StatekeelSaver, store: statekeel.Store
) -> None:
    big = "x" * 10_000
    cfg = await _put(saver, "t", {"doc": big, "step": 0}, {"doc": 1, "step": 1}, {"doc": 1, "step": 1})
    for i in range(1, 30):
        cfg = await _put(
            saver, "t", {"doc": big, "step": i}, {"doc": 1, "step": i + 1}, {"step": i + 1}, parent=cfg
        )
    # 30 checkpoints: the big channel is one blob, the changing one a blob per step.
    assert await _rows(store) == {"checkpoints": 30, "checkpoint_blobs": 31, "checkpoint_writes": 0}
    history = await _all(saver, generate_config("t"))
    assert [t.checkpoint["channel_values"]["step"] for t in history] == list(range(29, -1, -1))
    assert all(t.checkpoint["channel_values"]["doc"] == big for t in history)


async def test_channel_dropped_from_versions_is_absent_and_empty_channel_has_no_value(
    saver: StatekeelSaver,
) -> None:
    # "b" has a version but no value (LangGraph's empty channel): stored as such, loaded as absent.
    cfg = await _put(saver, "t", {"a": 1}, {"a": 1, "b": 1}, {"a": 1, "b": 1})
    tup = await saver.aget_tuple(cfg)
    assert tup is not None and tup.checkpoint["channel_values"] == {"a": 1}
    assert tup.checkpoint["channel_versions"] == {"a": 1, "b": 1}


async def test_values_round_trip_through_the_serializer_exactly(saver: StatekeelSaver) -> None:
    values = {
        "bytes": b"\x00\xff",
        "set": {1, 2},
        "uuid": uuid.UUID(int=7),
        "nested": {"k": [1.5, None, True]},
        "nan_free": -0.0,
        "unicode": "é\u2028",
        'we"ird.ch[0] é$': "a channel name that needs escaping in JSON and in a JSON path",
    }
    versions = {k: 1 for k in values}
    cfg = await _put(saver, "t", values, versions, versions)
    tup = await saver.aget_tuple(cfg)
    assert tup is not None and tup.checkpoint["channel_values"] == values


async def test_put_same_checkpoint_again_replaces_metadata_and_keeps_history(
    saver: StatekeelSaver, store: statekeel.Store
) -> None:
    config = generate_config("t")
    cp = generate_checkpoint(channel_values={"a": 1}, channel_versions={"a": 1})
    await saver.aput(config, cp, generate_metadata(step=1), {"a": 1})
    await saver.aput(config, cp, generate_metadata(step=2), {"a": 1})
    listed = await _all(saver, generate_config("t"))
    assert [t.metadata["step"] for t in listed] == [2]
    assert (await _rows(store))["checkpoint_blobs"] == 1


async def test_special_channel_write_replaces_and_regular_write_is_kept(saver: StatekeelSaver) -> None:
    cfg = await _put(saver, "t", {}, {}, {})
    await saver.aput_writes(cfg, [("ch", "first")], "task-1")
    await saver.aput_writes(cfg, [("ch", "second")], "task-1")
    await saver.aput_writes(cfg, [(INTERRUPT, "one")], "task-2")
    await saver.aput_writes(cfg, [(INTERRUPT, "two")], "task-2")
    await saver.aput_writes(cfg, [(ERROR, "boom")], "task-3", task_path="~a")
    tup = await saver.aget_tuple(cfg)
    assert tup is not None
    # writes_sort_key order: (task_path, task_id, idx)
    assert tup.pending_writes == [
        ("task-1", "ch", "first"),
        ("task-2", INTERRUPT, "two"),
        ("task-3", ERROR, "boom"),
    ]


async def test_put_is_one_transaction_a_failure_after_the_row_leaves_nothing(
    saver: StatekeelSaver, store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from statekeel.backends.sql import checkpoints as ops

    original = ops.op_put_checkpoint

    async def fail_after_writing(tx: Any, cp: Any) -> None:
        await original(tx, cp)  # the checkpoint row and its blobs are written, then the transaction fails
        raise RuntimeError("fault injected after the writes")

    monkeypatch.setattr(ops, "op_put_checkpoint", fail_after_writing)
    with pytest.raises(RuntimeError, match="fault injected"):
        await _put(saver, "t", {"a": 1, "b": 2}, {"a": 1, "b": 1}, {"a": 1, "b": 1})
    assert await _rows(store) == {t: 0 for t in TABLES}
    monkeypatch.setattr(ops, "op_put_checkpoint", original)
    cfg = await _put(saver, "t", {"a": 1, "b": 2}, {"a": 1, "b": 1}, {"a": 1, "b": 1})
    assert (await saver.aget_tuple(cfg)) is not None
    assert await _rows(store) == {"checkpoints": 1, "checkpoint_blobs": 2, "checkpoint_writes": 0}


# --- listing -----------------------------------------------------------------------------------------------


async def test_list_pages_through_a_long_history_newest_first(saver: StatekeelSaver) -> None:
    cfg = None
    ids = []
    for i in range(230):
        cfg = await _put(saver, "long", {}, {}, {}, parent=cfg, step=i)
        ids.append(cfg["configurable"]["checkpoint_id"])
    ids.reverse()
    assert [t.checkpoint["id"] for t in await _all(saver, generate_config("long"))] == ids
    assert [t.checkpoint["id"] for t in await _all(saver, generate_config("long"), limit=150)] == ids[:150]
    before = generate_config("long", checkpoint_id=ids[10])
    got = await _all(saver, generate_config("long"), before=before, limit=120)
    assert [t.checkpoint["id"] for t in got] == ids[11:131]
    assert [t.metadata["step"] for t in await _all(saver, generate_config("long"), filter={"step": 7})] == [7]


async def test_list_without_config_spans_threads_and_namespaces(saver: StatekeelSaver) -> None:
    for thread in ("a", "b"):
        for ns in ("", "child:1"):
            await _put(saver, thread, {}, {}, {}, ns=ns, owner=thread)
    everything = await _all(saver, None)
    assert len(everything) == 4
    assert sorted(t.config["configurable"]["checkpoint_id"] for t in everything) == sorted(
        t.checkpoint["id"] for t in everything
    )
    ids = [t.checkpoint["id"] for t in everything]
    assert ids == sorted(ids, reverse=True)
    assert {
        t.config["configurable"]["thread_id"] for t in await _all(saver, None, filter={"owner": "b"})
    } == {"b"}
    # A thread without a namespace in its config lists every namespace of the thread.
    assert len(await _all(saver, {"configurable": {"thread_id": "a"}})) == 2
    assert len(await _all(saver, None, limit=3)) == 3


async def test_list_pages_exactly_once_through_copies_sharing_checkpoint_ids(saver: StatekeelSaver) -> None:
    cfg = None
    for i in range(45):
        cfg = await _put(saver, "src", {}, {}, {}, parent=cfg, step=i)
    for target in ("copy-b", "copy-a"):
        await saver.acopy_thread("src", target)
    # 135 checkpoints, each id held by three threads: pages of 100 must split inside a group of equal ids
    listed = [(t.checkpoint["id"], t.config["configurable"]["thread_id"]) for t in await _all(saver, None)]
    assert len(listed) == len(set(listed)) == 135
    assert listed == sorted(listed, reverse=True)
    limited = await _all(saver, None, limit=101)
    assert [(t.checkpoint["id"], t.config["configurable"]["thread_id"]) for t in limited] == listed[:101]


async def test_metadata_filter_matches_by_value(saver: StatekeelSaver) -> None:
    await _put(saver, "t", {}, {}, {}, score=1, tags={"b": 2, "a": [1, "x"]}, note=None)
    await _put(saver, "t", {}, {}, {}, score=2.5, **{'a.b"[0]': "odd key"})
    cfg = generate_config("t")

    async def match(**flt: Any) -> int:
        return len(await _all(saver, cfg, filter=flt))

    assert await match(score=1) == 1
    assert await match(score=1.0) == 1  # 1 == 1.0, as in Python
    assert await match(score=2.5) == 1
    assert await match(score="1") == 0
    assert await match(tags={"a": [1, "x"], "b": 2}) == 1  # key order does not matter
    assert await match(tags={"a": [1, "x"]}) == 0  # a whole value, not a subset
    assert await match(note=None) == 2  # null matches null and a missing key, like dict.get
    assert await match(missing=None, score=2.5) == 1
    assert await match(source="loop", score=1) == 1
    assert await match(**{'a.b"[0]': "odd key"}) == 1


async def test_unknown_checkpoint_id_gets_none_and_lists_nothing(
    saver: StatekeelSaver, store: statekeel.Store
) -> None:
    await _put(saver, "t", {"a": 1}, {"a": 1}, {"a": 1})
    before = await _rows(store)
    assert await saver.aget_tuple(generate_config("t", checkpoint_id="no-such-checkpoint")) is None
    assert await saver.aget_tuple(generate_config("no-such-thread")) is None
    assert await _all(saver, generate_config("t", checkpoint_id="no-such-checkpoint")) == []
    await saver.acopy_thread("no-such-thread", "target")
    assert await _all(saver, generate_config("target")) == []
    assert await _rows(store) == before


# --- deleting, pruning, copying ----------------------------------------------------------------------------


async def test_prune_keep_latest_reclaims_values_no_checkpoint_uses(
    saver: StatekeelSaver, store: statekeel.Store
) -> None:
    cfg = await _put(saver, "t", {"a": "a1", "b": "b1"}, {"a": 1, "b": 1}, {"a": 1, "b": 1})
    for i in range(2, 6):
        cfg = await _put(saver, "t", {"a": f"a{i}", "b": "b1"}, {"a": i, "b": 1}, {"a": i}, parent=cfg)
        await saver.aput_writes(cfg, [("a", i)], f"task-{i}")
    other = await _put(saver, "other", {"a": "x"}, {"a": 1}, {"a": 1})
    await saver.aprune(["t"], strategy="keep_latest")
    # t keeps its newest checkpoint, its writes and the two blobs it uses; "other" is untouched.
    assert await _rows(store) == {"checkpoints": 2, "checkpoint_blobs": 3, "checkpoint_writes": 1}
    tup = await saver.aget_tuple(generate_config("t"))
    assert tup is not None and tup.checkpoint["channel_values"] == {"a": "a5", "b": "b1"}
    assert tup.pending_writes == [("task-5", "a", 5)]
    assert (await saver.aget_tuple(other)) is not None


async def test_delete_for_runs_reclaims_their_values_and_keeps_shared_ones(
    saver: StatekeelSaver, store: statekeel.Store
) -> None:
    first = await _put(
        saver, "t", {"a": "shared", "b": "b1"}, {"a": 1, "b": 1}, {"a": 1, "b": 1}, run_id="r1"
    )
    await _put(saver, "t", {"a": "shared", "b": "b2"}, {"a": 1, "b": 2}, {"b": 2}, parent=first, run_id="r2")
    await saver.adelete_for_runs(["r2"])
    assert await _rows(store) == {"checkpoints": 1, "checkpoint_blobs": 2, "checkpoint_writes": 0}
    await saver.adelete_for_runs(["r1"])
    assert await _rows(store) == {"checkpoints": 0, "checkpoint_blobs": 0, "checkpoint_writes": 0}


async def test_delete_thread_removes_values_and_writes_too(
    saver: StatekeelSaver, store: statekeel.Store
) -> None:
    cfg = await _put(saver, "t", {"a": 1}, {"a": 1}, {"a": 1}, ns="")
    await saver.aput_writes(cfg, [("a", 2)], "task")
    await _put(saver, "t", {"a": 1}, {"a": 1}, {"a": 1}, ns="child:1")
    await _put(saver, "keep", {"a": 1}, {"a": 1}, {"a": 1})
    await saver.adelete_thread("t")
    assert await _rows(store) == {"checkpoints": 1, "checkpoint_blobs": 1, "checkpoint_writes": 0}


async def test_copy_store_moves_checkpoints_to_another_backend(saver: StatekeelSaver, tmp_path: Any) -> None:
    cfg = await _put(
        saver, "t", {"a": b"\x00bytes", "b": {"k": 1}}, {"a": 1, "b": 1}, {"a": 1, "b": 1}, run_id="r"
    )
    cfg = await _put(saver, "t", {"a": b"\x00bytes", "b": {"k": 2}}, {"a": 1, "b": 2}, {"b": 2}, parent=cfg)
    await saver.aput_writes(cfg, [("a", b"w"), (INTERRUPT, {"q": "?"})], "task", task_path="p")
    dst_url = f"sqlite:///{os.path.join(os.fspath(tmp_path), 'copy.db')}"
    report = await statekeel.copy_store(saver.store, dst_url)
    assert report.verified
    async with StatekeelSaver.from_url(dst_url) as copied:
        src = await _all(saver, generate_config("t"))
        dst = await _all(copied, generate_config("t"))
        assert [(t.config, t.checkpoint, t.metadata, t.parent_config, t.pending_writes) for t in dst] == [
            (t.config, t.checkpoint, t.metadata, t.parent_config, t.pending_writes) for t in src
        ]
        await copied.adelete_for_runs(["r"])  # the run id column came along
        assert len(await _all(copied, generate_config("t"))) == 1


# --- bad input: typed errors, nothing written ---------------------------------------------------------------


BAD_CONFIGS = [
    pytest.param({}, id="no-configurable"),
    pytest.param({"configurable": {}}, id="no-thread-id"),
    pytest.param({"configurable": {"thread_id": ""}}, id="empty-thread-id"),
    pytest.param({"configurable": {"thread_id": None}}, id="none-thread-id"),
    pytest.param({"configurable": {"thread_id": ["t"]}}, id="list-thread-id"),
    pytest.param({"configurable": {"thread_id": "a\x00b"}}, id="nul-thread-id"),
    pytest.param({"configurable": {"thread_id": "t" * 600}}, id="long-thread-id"),
    pytest.param({"configurable": {"thread_id": "t", "checkpoint_ns": 5}}, id="int-namespace"),
    pytest.param("thread-1", id="not-a-dict"),
]


@pytest.mark.parametrize("config", BAD_CONFIGS)
async def test_config_without_a_usable_thread_id_is_a_value_error_and_writes_nothing(
    saver: StatekeelSaver, store: statekeel.Store, config: Any
) -> None:
    cp = generate_checkpoint(channel_values={"a": 1}, channel_versions={"a": 1})
    with pytest.raises(statekeel.InvalidConfig) as info:
        await saver.aput(config, cp, generate_metadata(), {"a": 1})
    assert isinstance(info.value, ValueError) and isinstance(info.value, statekeel.InvalidArgument)
    with pytest.raises(ValueError):
        await saver.aget_tuple(config)
    with pytest.raises(ValueError):
        await _all(saver, config)
    with pytest.raises(ValueError):
        await saver.aput_writes(config, [("a", 1)], "task")
    assert await _rows(store) == {t: 0 for t in TABLES}


async def test_thread_id_given_as_int_or_uuid_is_stored_as_text(saver: StatekeelSaver) -> None:
    tid = uuid.uuid4()
    cp = empty_checkpoint()
    stored = await saver.aput({"configurable": {"thread_id": tid}}, cp, generate_metadata(), {})
    assert stored["configurable"]["thread_id"] == str(tid)
    assert await saver.aget_tuple({"configurable": {"thread_id": str(tid)}}) is not None
    await saver.aput({"configurable": {"thread_id": 42}}, empty_checkpoint(), generate_metadata(), {})
    assert await saver.aget_tuple({"configurable": {"thread_id": "42"}}) is not None


async def test_unserializable_channel_value_is_a_type_and_value_error_and_writes_nothing(
    saver: StatekeelSaver, store: statekeel.Store
) -> None:
    first = await _put(saver, "t", {"a": 1}, {"a": 1}, {"a": 1})
    before = await _rows(store)
    cp = generate_checkpoint(
        channel_values={"a": 2, "bad": lambda: None}, channel_versions={"a": 2, "bad": 1}
    )
    config = generate_config("t", checkpoint_id=first["configurable"]["checkpoint_id"])
    with pytest.raises(statekeel.UnserializableValue) as info:
        await saver.aput(config, cp, generate_metadata(), {"a": 2, "bad": 1})
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    assert isinstance(info.value, statekeel.SerializationError)
    assert "channel 'bad'" in str(info.value)
    with pytest.raises(TypeError):
        await saver.aput_writes(first, [("a", 3), ("b", object())], "task")
    with pytest.raises(statekeel.UnserializableValue):  # metadata is JSON: a function is not
        await saver.aput(generate_config("t"), generate_checkpoint(), generate_metadata(hook=print), {})
    assert await _rows(store) == before
    # The store is still usable and the thread's newest checkpoint is still the good one.
    tup = await saver.aget_tuple(generate_config("t"))
    assert tup is not None and tup.checkpoint["channel_values"] == {"a": 1}


async def test_value_over_max_record_bytes_is_payload_too_large_and_writes_nothing(
    store_url: str, tmp_path: Any
) -> None:
    store = await statekeel.open_store(
        store_url, max_record_bytes=10_000, fallback_dir=os.path.join(os.fspath(tmp_path), "fb")
    )
    try:
        saver = StatekeelSaver(store)
        with pytest.raises(statekeel.PayloadTooLarge):
            await _put(saver, "t", {"a": "x" * 20_000}, {"a": 1}, {"a": 1})
        assert await _rows(store) == {t: 0 for t in TABLES}
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: _all(s, generate_config("t"), limit=-1), "limit"),
        (lambda s: _all(s, generate_config("t"), limit=True), "limit"),
        (lambda s: _all(s, generate_config("t"), before=generate_config("t")), "before"),
        (lambda s: _all(s, generate_config("t"), filter=[("step", 1)]), "filter"),
        (lambda s: s.aput_writes(generate_config("t"), [("a", 1)], "task"), "checkpoint_id"),
        (lambda s: s.aput_writes(generate_config("t", checkpoint_id="c"), [("a", 1, 2)], "task"), "pair"),
        (lambda s: s.aput_writes(generate_config("t", checkpoint_id="c"), [("a", 1)], ""), "task_id"),
        (lambda s: s.aprune(["t"], strategy="keep_oldest"), "strategy"),
        (lambda s: s.aprune("t"), "list"),
        (lambda s: s.adelete_for_runs("run"), "list"),
        (lambda s: s.adelete_thread(""), "thread_id"),
        (lambda s: s.acopy_thread("a", None), "target_thread_id"),
        (lambda s: s.aput(generate_config("t"), {"v": 1}, generate_metadata(), {}), "checkpoint"),
        (
            lambda s: s.aput(
                generate_config("t"),
                generate_checkpoint(channel_values={"a": 1}),
                generate_metadata(),
                {"a": [1]},
            ),
            "version",
        ),
    ],
)
async def test_malformed_argument_is_invalid_config_before_any_write(
    saver: StatekeelSaver, store: statekeel.Store, call: Any, message: str
) -> None:
    with pytest.raises(statekeel.InvalidConfig, match=message):
        await call(saver)
    assert await _rows(store) == {t: 0 for t in TABLES}


async def test_saver_needs_a_store() -> None:
    with pytest.raises(statekeel.InvalidArgument, match="from_url"):
        StatekeelSaver("sqlite:///x.db")  # type: ignore[arg-type]
