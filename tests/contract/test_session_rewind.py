"""Rewind on every backend: the tail leaves the live transcript for the archive under a rewind record in
one transaction; the next append takes its place; writers that were not told conflict; forks keep their
history; bad input writes nothing."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

import statekeel
from statekeel.backends.sql import branches
from statekeel.errors import ConflictError, InvalidArgument, NotFound, StepInDoubt


async def make(store: statekeel.Store, key: str, n: int, prefix: str = "m") -> statekeel.Session:
    s = await store.sessions.get_or_create(key)
    for i in range(n):
        s.add_message("user" if i % 2 == 0 else "assistant", f"{prefix}{i}")
    await store.sessions.save(s)
    return s


def contents(messages: list[dict[str, Any]]) -> list[Any]:
    return [m["content"] for m in messages]


async def fresh(store: statekeel.Store, key: str, **kw: Any) -> statekeel.Session:
    store.sessions._cache.pop(key, None)
    s = await store.sessions.load(key, **kw)
    assert s is not None
    return s


async def rows(store: statekeel.Store, key: str) -> list[tuple[int, Any]]:
    found = await store.backend.load_session_with_messages(key, include_archived=True)
    assert found is not None
    record, messages = found
    assert [m.seq for m in messages] == list(range(record.head_seq))  # dense
    return [(m.seq, m.payload["content"]) for m in messages]


async def test_rewind_moves_the_tail_to_the_archive_and_the_next_append_takes_its_place(
    store: statekeel.Store,
) -> None:
    await make(store, "s", 6)
    rw = await store.sessions.rewind("s", 4, reason="retry turn 4")
    assert isinstance(rw, statekeel.Rewind)
    assert (rw.key, rw.to_seq, rw.upto_seq, rw.reason) == ("s", 4, 6, "retry turn 4")
    s = await fresh(store, "s")
    assert contents(s.messages) == ["m0", "m1", "m2", "m3"] and s.head_seq == 4
    archived = await store.sessions.archived("s", rw.compression_id)
    assert [(a.seq, a.payload["content"], a.summary) for a in archived] == [
        (4, "m4", "retry turn 4"),
        (5, "m5", "retry turn 4"),
    ]
    s.add_message("user", "again")
    await store.sessions.save(s)
    assert await rows(store, "s") == [(0, "m0"), (1, "m1"), (2, "m2"), (3, "m3"), (4, "again")]
    # The rewound messages stay where the rewind put them; they are no compression summary.
    assert [(a.seq, a.payload["content"]) for a in await store.sessions.archived("s", rw.compression_id)] == [
        (4, "m4"),
        (5, "m5"),
    ]
    assert (await fresh(store, "s")).summaries == []
    assert await store.sessions.rewinds("s") == [rw]


async def test_seqs_are_dense_in_the_live_view_and_never_held_twice_within_one_number_space(
    store: statekeel.Store,
) -> None:
    # A seq is a position in a transcript. The live transcript (with what compression archived of it) is
    # one number space, dense from 0; each rewind record is one of its own, holding the seqs its messages
    # had. So after a rewind a seq is held by the live message and by the rewound one, each named by its
    # number space: (None, seq) live or compressed, (rewind's compression_id, seq) rewound. Nothing is
    # ever renumbered, and no (number space, seq) is ever held by two messages.
    s = await make(store, "s", 6)
    await store.sessions.compress("s", 2, "first two")
    first = await store.sessions.rewind("s", 4, reason="retry 4")
    s = await fresh(store, "s")
    s.add_message("user", "a4")
    s.add_message("assistant", "a5")
    await store.sessions.save(s)
    second = await store.sessions.rewind("s", 5, reason="retry 5")
    s = await fresh(store, "s")
    s.add_message("assistant", "b5")
    await store.sessions.save(s)
    live = await rows(store, "s")  # dense from 0 (checked in rows)
    assert live == [(0, "m0"), (1, "m1"), (2, "m2"), (3, "m3"), (4, "a4"), (5, "b5")]
    compressed = [a.seq for a in await store.sessions.archived("s")]
    assert compressed == [0, 1] and [seq for seq, _ in live[2:]] == [2, 3, 4, 5]  # disjoint, no gap
    held: dict[tuple[str | None, int], Any] = {(None, seq): text for seq, text in live}
    for rw in (first, second):
        for a in await store.sessions.archived("s", rw.compression_id):
            assert (rw.compression_id, a.seq) not in held
            held[(rw.compression_id, a.seq)] = a.payload["content"]
    assert {k: v for k, v in held.items() if k[0] is not None} == {
        (first.compression_id, 4): "m4",
        (first.compression_id, 5): "m5",
        (second.compression_id, 5): "a5",
    }
    # The rewound messages keep the seqs they had; the live ones at those positions are other messages.
    assert held[(None, 5)] == "b5" and held[(first.compression_id, 5)] == "m5"


async def test_the_cached_session_follows_its_rewind(store: statekeel.Store) -> None:
    s = await make(store, "s", 5)
    await store.sessions.rewind("s", 2, reason="undo")
    assert contents(s.messages) == ["m0", "m1"] and s.head_seq == 2
    s.add_message("user", "x")
    await store.sessions.save(s)
    assert contents((await fresh(store, "s")).messages) == ["m0", "m1", "x"]


async def test_a_session_loaded_before_a_rewind_conflicts_even_at_the_same_head(
    store_url: str, tmp_path: Any
) -> None:
    if store_url == "memory://":
        pytest.skip("needs a second store on the same database")
    async with (
        statekeel.open_store(store_url, fallback_dir=str(tmp_path / "a")) as a,
        statekeel.open_store(store_url, fallback_dir=str(tmp_path / "b")) as b,
    ):
        await make(a, "s", 2)
        stale = await b.sessions.load("s")  # head 2
        assert stale is not None
        more = await fresh(a, "s")
        more.add_message("user", "m2")
        await a.sessions.save(more)  # head 3
        await a.sessions.rewind("s", 2, reason="undo m2")  # head 2 again
        stale.add_message("user", "stale")
        with pytest.raises(ConflictError):
            await b.sessions.save(stale)
        assert await rows(a, "s") == [(0, "m0"), (1, "m1")]


async def test_a_writer_that_appended_first_makes_the_rewind_conflict(store_url: str, tmp_path: Any) -> None:
    if store_url == "memory://":
        pytest.skip("needs a second store on the same database")
    async with (
        statekeel.open_store(store_url, fallback_dir=str(tmp_path / "a")) as a,
        statekeel.open_store(store_url, fallback_dir=str(tmp_path / "b")) as b,
    ):
        await make(a, "s", 3)
        before = await a.backend.load_session("s")
        assert before is not None
        other = await b.sessions.load("s")
        assert other is not None
        other.add_message("user", "theirs")
        await b.sessions.save(other)
        with pytest.raises(ConflictError, match="another writer appended"):
            await a.backend.rewind_session(
                "s", 1, reason="r", compression_id="c1", expected_head=before.head_seq
            )
        assert await rows(a, "s") == [(0, "m0"), (1, "m1"), (2, "m2"), (3, "theirs")]


async def test_rewind_refuses_bad_input_and_writes_nothing(store: statekeel.Store) -> None:
    await make(store, "s", 4)
    await store.sessions.compress("s", 2, "first two")
    with pytest.raises(InvalidArgument, match="compressed"):
        await store.sessions.rewind("s", 1, reason="r")
    with pytest.raises(InvalidArgument):
        await store.sessions.rewind("s", 4, reason="r")  # nothing after the head
    with pytest.raises(InvalidArgument):
        await store.sessions.rewind("s", -1, reason="r")
    with pytest.raises(InvalidArgument):
        await store.sessions.rewind("s", 3, reason="  ")
    with pytest.raises(NotFound):
        await store.sessions.rewind("nope", 0, reason="r")
    assert await rows(store, "s") == [(0, "m0"), (1, "m1"), (2, "m2"), (3, "m3")]


async def test_a_fork_keeps_its_history_when_its_parent_is_rewound(store: statekeel.Store) -> None:
    await make(store, "p", 6)
    f = await store.sessions.fork("p", 5, new_key="f")
    f.add_message("user", "f5")
    await store.sessions.save(f)
    early = await store.sessions.fork("p", 2, new_key="early")
    await store.sessions.rewind("p", 3, reason="undo")
    p = await fresh(store, "p")
    p.add_message("user", "p3")
    await store.sessions.save(p)
    f2 = await fresh(store, "f")
    assert contents(f2.messages) == ["m0", "m1", "m2", "m3", "m4", "f5"]
    assert f2.parent == ("p", 3)  # it holds m3, m4 itself now
    assert await rows(store, "f") == [(0, "m0"), (1, "m1"), (2, "m2"), (3, "m3"), (4, "m4"), (5, "f5")]
    assert contents((await fresh(store, "early")).messages) == ["m0", "m1"] and early.parent == ("p", 2)
    assert await rows(store, "p") == [(0, "m0"), (1, "m1"), (2, "m2"), (3, "p3")]


async def test_a_fork_rewound_into_what_it_inherited(store: statekeel.Store) -> None:
    await make(store, "p", 4)
    f = await store.sessions.fork("p", 3, new_key="f")
    f.add_message("user", "f3")
    await store.sessions.save(f)
    rw = await store.sessions.rewind("f", 1, reason="back to the start")
    f2 = await fresh(store, "f")
    assert contents(f2.messages) == ["m0"] and f2.parent == ("p", 1)
    assert [(a.seq, a.payload["content"]) for a in await store.sessions.archived("f", rw.compression_id)] == [
        (1, "m1"),
        (2, "m2"),
        (3, "f3"),
    ]
    f2.add_message("user", "f1")
    await store.sessions.save(f2)
    assert await rows(store, "f") == [(0, "m0"), (1, "f1")]
    assert await rows(store, "p") == [(0, "m0"), (1, "m1"), (2, "m2"), (3, "m3")]


async def test_deleting_a_rewound_session_removes_its_rewind_records(store: statekeel.Store) -> None:
    await make(store, "s", 3)
    await store.sessions.rewind("s", 1, reason="r")
    assert await store.sessions.delete("s")
    await make(store, "s", 1, "new")
    assert await rows(store, "s") == [(0, "new0")]


CALL = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}


async def test_a_call_a_rewind_leaves_waiting_is_the_rewinders_until_it_is_gone(
    store_url: str, tmp_path: Any
) -> None:
    if store_url == "memory://":
        pytest.skip("needs a second store on the same database")
    async with statekeel.open_store(store_url, fallback_dir=str(tmp_path / "a")) as a:
        s = await a.sessions.get_or_create("s")
        s.add_message("user", "run it")
        s.add_message("assistant", None, tool_calls=[CALL])
        s.add_message("tool", "3", tool_call_id="c1")
        await a.sessions.save(s)
        await a.sessions.rewind("s", 2, reason="drop the result")  # the call waits again
        again = await fresh(a, "s")
        assert again.repaired == () and [c.call_id for c in again.pending_calls()] == ["c1"]
    async with statekeel.open_store(store_url, fallback_dir=str(tmp_path / "b")) as b:
        later = await fresh(b, "s")  # its rewinder is gone: answered once, as any left call
        assert [c.call_id for c in later.repaired] == ["c1"] and later.pending_calls() == []


# --- stored references carry the rewind count they were taken under -------------------------------------


async def _fallen_back_then_rewound_and_regrown(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Host A acknowledges "old branch" at seq 4 to its fallback file (the backend is down for it); host B
    then rewinds the session to 2 and grows it back to head 4, the file's base head."""
    await make(store, "s", 4)
    mine = await store.sessions.load("s")
    assert mine is not None
    mine.add_message("user", "old branch")

    async def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise statekeel.BackendUnavailable("the database is down for host A (simulated)")

    with monkeypatch.context() as patch:
        patch.setattr(store.backend, "append_messages", unavailable)
        await store.sessions.save(mine)
    assert mine.fallback_file is not None
    other_host = statekeel.SessionManager(store.backend, store.codec)
    try:
        theirs = await other_host.load("s")
        assert theirs is not None
        await other_host.rewind("s", 2, reason="host B goes back")
        theirs.add_message("user", "y2")
        theirs.add_message("assistant", "y3")
        await other_host.save(theirs)  # head 4 again, one rewind later
    finally:
        await other_host.close()


@pytest.mark.parametrize("reader", ["replay", "load", "own replay"])
async def test_a_fallback_file_taken_before_a_rewind_is_quarantined_never_spliced_onto_the_new_branch(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, reader: str
) -> None:
    await _fallen_back_then_rewound_and_regrown(store, monkeypatch)
    fb = tmp_path / "fallback"
    if reader == "own replay":  # host A, still running, replays the file its cached session holds
        report = await store.sessions.replay_fallback()
        assert report.replayed == {} and len(report.quarantined) == 1
        assert "rewound" in next(iter(report.quarantined.values()))
        mine = store.sessions.cached("s")
        assert mine is not None
        with pytest.raises(ConflictError):
            await store.sessions.save(mine)  # loaded before the rewind: refused like any stale save
    restarted = statekeel.SessionManager(store.backend, store.codec, fallback_dir=fb)  # host A, restarted
    try:
        if reader == "replay":
            report = await restarted.replay_fallback()
            assert report.replayed == {} and len(report.quarantined) == 1
            assert "rewound" in next(iter(report.quarantined.values()))
        else:
            loaded = await restarted.load("s")
            assert loaded is not None and contents(loaded.messages) == ["m0", "m1", "y2", "y3"]
            assert loaded.fallback_file is None
            if reader == "load":
                assert "rewound" in next(iter((await restarted.replay_fallback()).quarantined.values()))
    finally:
        await restarted.close()
    assert await rows(store, "s") == [(0, "m0"), (1, "m1"), (2, "y2"), (3, "y3")]
    kept = [p for p in fb.iterdir() if ".corrupt-" in p.name]
    assert len(kept) == 1 and b"old branch" in kept[0].read_bytes()  # kept aside, never lost


async def test_a_tool_call_that_ran_is_never_answered_as_not_run_after_a_rewind_took_its_result(
    store: statekeel.Store,
) -> None:
    first = statekeel.SessionManager(store.backend, store.codec)  # a process that ran the tool, then left
    s = await first.get_or_create("s")
    s.add_message("user", "charge the card")
    s.add_message("assistant", None, tool_calls=[CALL])
    await first.save(s)
    assert await first.run_tool(s, "c1", lambda: "charged 3 EUR") == "charged 3 EUR"
    rw = await first.rewind("s", 2, reason="drop the result")
    await first.close()
    nxt = statekeel.SessionManager(store.backend, store.codec)  # the next process
    try:
        later = await nxt.load("s")
        assert later is not None
        # Not "interrupted: the agent stopped before this tool call returned": it ran.
        assert later.repaired == () and [c.call_id for c in later.pending_calls()] == ["c1"]
        assert await rows(store, "s") == [(0, "charge the card"), (1, None)]
        found = await nxt.recover_tool_calls(repair=True)
        assert found.repaired == {}
        assert [(d.call_id, d.status, d.result_seq) for d in found.in_doubt] == [("c1", "succeeded", 2)]
        ran: list[int] = []
        with pytest.raises(StepInDoubt, match="rewind took that result out"):
            await nxt.run_tool(later, "c1", lambda: ran.append(1))
        assert ran == []  # not run a second time
        # Its recorded result is where the rewind put it.
        assert [(a.seq, a.payload["content"]) for a in await nxt.archived("s", rw.compression_id)] == [
            (2, "charged 3 EUR")
        ]
    finally:
        await nxt.close()


async def test_locate_resolves_a_reference_by_the_rewind_count_it_was_taken_under(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = await make(store, "s", 6)
    assert s.rewinds == 0
    first = await store.sessions.rewind("s", 4, reason="retry 4")  # m4, m5 leave
    s.add_message("user", "a4")
    s.add_message("assistant", "a5")
    await store.sessions.save(s)
    assert s.rewinds == 1
    # The second rewinder's clock is an hour behind the first's: the records still list in rewind order.
    behind = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    monkeypatch.setattr(branches, "utcnow", lambda: behind)
    second = await store.sessions.rewind("s", 5, reason="retry 5")  # a5 leaves
    monkeypatch.undo()
    s.add_message("assistant", "b5")
    await store.sessions.save(s)
    assert await store.sessions.rewinds("s") == [first, second]
    loc = store.sessions.locate
    assert await loc("s", 4, rewinds=0) == first and await loc("s", 5, rewinds=0) == first  # m4, m5
    assert await loc("s", 4, rewinds=1) is None  # a4, still live
    assert await loc("s", 5, rewinds=1) == second  # a5
    assert await loc("s", 5, rewinds=2) is None and await loc("s", 3, rewinds=0) is None  # b5; m3
    with pytest.raises(InvalidArgument, match="3"):
        await loc("s", 5, rewinds=3)
    with pytest.raises(NotFound):
        await loc("nope", 0, rewinds=0)


# A line of forks k0 -> k1 -> k2 -> k3: k1 forks k0 at 6, k2 forks k1 at 8, k3 forks k2 at 9; k0 holds 10
# messages and every fork 4 of its own.
FORK_POINTS = (6, 8, 9)


def compression_plans(depth: int) -> list[tuple[int | None, ...]]:
    """Where each session of a line of ``depth`` forks is compressed up to (None: not at all): the root
    below the rewind point or not at all; each fork below the rewind point, just below its fork point (in
    what it inherited, above the rewind point) or past its fork point (into its own messages). Each
    session takes each of its places in some plan, next to each place of its parent."""
    plans = []
    for root in (None, 2):
        for shift in range(4):
            places = [(None, 2, point - 1, point + 2) for point in FORK_POINTS[:depth]]
            plans.append((root, *(p[(shift + i * (root or 1)) % 4] for i, p in enumerate(places))))
    return plans


async def fork_line(store: statekeel.Store, prefix: str, plan: tuple[int | None, ...]) -> list[str]:
    keys = [f"{prefix}-k{i}" for i in range(len(plan))]
    await make(store, keys[0], 10, "k0.")
    for i in range(1, len(plan)):
        f = await store.sessions.fork(keys[i - 1], FORK_POINTS[i - 1], new_key=keys[i])
        for j in range(4):
            f.add_message("user", f"k{i}.{j}")
        await store.sessions.save(f)
    for key, upto in zip(keys, plan, strict=True):
        if upto is not None:
            await store.sessions.compress(key, upto, f"up to {upto}")
    return keys


async def what_loads(store: statekeel.Store, key: str) -> tuple[Any, ...]:
    live = await fresh(store, key)
    whole = await fresh(store, key, include_archived=True)
    return (
        contents(live.messages),
        [(s.summary, s.upto_seq) for s in live.summaries],
        live.last_consolidated,
        live.head_seq,
        contents(whole.messages),
        await rows(store, key),
    )


@pytest.mark.parametrize("depth", [1, 2, 3])
async def test_a_rewind_never_breaks_a_fork_below_it_at_any_depth_with_compression_anywhere(
    store: statekeel.Store, depth: int
) -> None:
    # Every line of forks, every place of compression, a rewind of the root or of a fork into what it
    # inherited or into its own part: every other session of the line loads what it loaded before, also
    # after the rewound one grows again; the rewound one keeps its history up to the rewind point.
    broken = []
    for n, plan in enumerate(compression_plans(depth)):
        for target, to_seq in ((0, 3), (1, 3), (1, 7)):
            if target > depth or (plan[target] or 0) > to_seq:
                continue  # what was compressed is not rewound
            keys = await fork_line(store, f"line{n}-{target}-{to_seq}", plan)
            before = {key: await what_loads(store, key) for key in keys}
            await store.sessions.rewind(keys[target], to_seq, reason="undo")
            rewound = await fresh(store, keys[target])
            rewound.add_message("user", "again")
            await store.sessions.save(rewound)
            for i, key in enumerate(keys):
                try:
                    now = await what_loads(store, key)
                except statekeel.StatekeelError as e:
                    broken.append((plan, target, to_seq, key, repr(e)))
                    continue
                if i == target:
                    if now[4] != [*before[key][4][:to_seq], "again"]:
                        broken.append((plan, target, to_seq, key, now[4]))
                elif now != before[key]:
                    broken.append((plan, target, to_seq, key, before[key], now))
    assert broken == [], "\n".join(map(repr, broken))
