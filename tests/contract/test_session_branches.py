"""Branches on every backend: a fork shares its parent's prefix without copying it, forks of forks, the
fork's own messages, branches(), compression of either side, and deleting, expiring, archiving or purging
a parent without breaking its forks (erasing a parent erases its forks: tests/contract/test_erasure.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

import statekeel
from statekeel.errors import ConflictError, InvalidArgument, InvalidKey, NotFound


async def make(store: statekeel.Store, key: str, n: int, prefix: str = "m") -> None:
    s = await store.sessions.get_or_create(key)
    for i in range(n):
        s.add_message("user" if i % 2 == 0 else "assistant", f"{prefix}{i}")
    await store.sessions.save(s)


def contents(messages: list[dict[str, Any]]) -> list[Any]:
    return [m["content"] for m in messages]


async def fresh(store: statekeel.Store, key: str, **kw: Any) -> statekeel.Session:
    """The session as the backend holds it (not the cached object)."""
    store.sessions._cache.pop(key, None)
    s = await store.sessions.load(key, **kw)
    assert s is not None
    return s


async def view(store: statekeel.Store, key: str) -> list[Any]:
    """Every message of a session's history as the backend reads it row by row, checking density."""
    found = await store.backend.load_session_with_messages(key, include_archived=True)
    assert found is not None
    record, rows = found
    assert [r.seq for r in rows] == list(range(record.head_seq))
    assert all(r.session_key == key for r in rows)
    return [r.payload["content"] for r in rows]


async def test_fork_reads_the_parent_prefix_then_its_own_messages(store: statekeel.Store) -> None:
    await make(store, "p", 6)
    fork = await store.sessions.fork("p", 4, new_key="f")
    assert fork.key == "f" and fork.parent == ("p", 4)
    assert contents(fork.messages) == ["m0", "m1", "m2", "m3"]
    assert fork.head_seq == 4
    fork.add_message("user", "f4")
    await store.sessions.save(fork)
    f = await fresh(store, "f")
    assert contents(f.messages) == ["m0", "m1", "m2", "m3", "f4"]
    assert f.parent == ("p", 4) and f.saved_head == 5
    assert await view(store, "f") == ["m0", "m1", "m2", "m3", "f4"]
    # The parent is untouched and goes on on its own.
    p = await fresh(store, "p")
    assert contents(p.messages) == [f"m{i}" for i in range(6)] and p.parent is None
    p.add_message("user", "m6")
    await store.sessions.save(p)
    assert contents((await fresh(store, "f")).messages) == ["m0", "m1", "m2", "m3", "f4"]


async def test_fork_copies_no_message_rows(store: statekeel.Store) -> None:
    await make(store, "p", 50)
    before = await store.backend.count_rows("messages")
    await store.sessions.fork("p", 50, new_key="f")
    assert await store.backend.count_rows("messages") == before


async def test_fork_at_zero_and_at_the_head(store: statekeel.Store) -> None:
    await make(store, "p", 3)
    empty = await store.sessions.fork("p", 0, new_key="f0")
    assert empty.messages == [] and empty.parent == ("p", 0)
    whole = await store.sessions.fork("p", 3, new_key="f3")
    assert contents(whole.messages) == ["m0", "m1", "m2"]


async def test_fork_of_a_fork_reads_every_ancestor(store: statekeel.Store) -> None:
    await make(store, "a", 5, "a")
    b = await store.sessions.fork("a", 3, new_key="b")
    for i in range(3, 7):
        b.add_message("user", f"b{i}")
    await store.sessions.save(b)
    c = await store.sessions.fork("b", 5, new_key="c")
    assert c.parent == ("b", 5)
    c.add_message("user", "c5")
    await store.sessions.save(c)
    assert contents((await fresh(store, "c")).messages) == ["a0", "a1", "a2", "b3", "b4", "c5"]
    assert await view(store, "c") == ["a0", "a1", "a2", "b3", "b4", "c5"]
    # A fork of a fork inside what that fork inherited reads the grandparent only.
    d = await store.sessions.fork("b", 2, new_key="d")
    assert contents(d.messages) == ["a0", "a1"]
    assert await view(store, "d") == ["a0", "a1"]


async def test_branches_lists_the_direct_forks_with_their_fork_point(store: statekeel.Store) -> None:
    await make(store, "p", 6)
    assert await store.sessions.branches("p") == []
    await store.sessions.fork("p", 4, new_key="f4")
    await store.sessions.fork("p", 2, new_key="f2")
    await store.sessions.fork("f2", 1, new_key="g")
    branches = await store.sessions.branches("p")
    assert [(b.key, b.at_seq) for b in branches] == [("f2", 2), ("f4", 4)]
    assert all(isinstance(b, statekeel.Branch) for b in branches)
    assert [(b.key, b.at_seq) for b in await store.sessions.branches("f2")] == [("g", 1)]


async def test_fork_without_a_key_gets_a_fresh_one_and_the_parents_metadata(store: statekeel.Store) -> None:
    s = await store.sessions.get_or_create("p")
    s.metadata["title"] = "t"
    s.add_message("user", "hi")
    await store.sessions.save(s)
    f1 = await store.sessions.fork("p", 1)
    f2 = await store.sessions.fork("p", 1)
    assert f1.key != f2.key and f1.key.startswith("p/fork-")
    assert f1.metadata == {"title": "t"}


async def test_fork_refuses_bad_input_and_writes_nothing(store: statekeel.Store) -> None:
    await make(store, "p", 2)
    with pytest.raises(InvalidArgument, match="outside"):
        await store.sessions.fork("p", 3, new_key="f")
    with pytest.raises(InvalidArgument):
        await store.sessions.fork("p", -1, new_key="f")
    with pytest.raises(InvalidArgument):
        await store.sessions.fork("p", True, new_key="f")  # type: ignore[arg-type]
    with pytest.raises(InvalidKey):
        await store.sessions.fork("p", 1, new_key="")
    with pytest.raises(NotFound):
        await store.sessions.fork("nope", 0, new_key="f")
    await make(store, "taken", 1)
    with pytest.raises(ConflictError, match="already exists"):
        await store.sessions.fork("p", 1, new_key="taken")
    assert await store.sessions.load("f") is None
    assert contents((await fresh(store, "taken")).messages) == ["m0"]


async def test_a_fork_survives_its_parent_being_compressed(store: statekeel.Store) -> None:
    await make(store, "p", 6)
    await store.sessions.fork("p", 5, new_key="f")
    await store.sessions.compress("p", 4, "the first four")
    f = await fresh(store, "f")
    assert contents(f.messages) == ["m0", "m1", "m2", "m3", "m4"]
    # Forking after the compression reads the parent's archive too.
    g = await store.sessions.fork("p", 6, new_key="g")
    assert contents(g.messages) == [f"m{i}" for i in range(6)]


async def test_a_fork_compresses_what_it_inherited_into_its_own_archive(store: statekeel.Store) -> None:
    await make(store, "p", 4)
    f = await store.sessions.fork("p", 3, new_key="f")
    f.add_message("user", "f3")
    f.add_message("user", "f4")
    await store.sessions.save(f)
    cid = await store.sessions.compress("f", 4, "up to f3")
    f = await fresh(store, "f")
    assert contents(f.messages) == ["f4"] and f.last_consolidated == 4
    archived = await store.sessions.archived("f", cid)
    assert [(a.seq, a.payload["content"]) for a in archived] == [(0, "m0"), (1, "m1"), (2, "m2"), (3, "f3")]
    assert contents((await fresh(store, "f", include_archived=True)).messages) == [
        "m0",
        "m1",
        "m2",
        "f3",
        "f4",
    ]
    # The parent keeps its own messages.
    assert contents((await fresh(store, "p")).messages) == ["m0", "m1", "m2", "m3"]


async def test_deleting_a_parent_keeps_its_forks_whole(store: statekeel.Store) -> None:
    await make(store, "a", 5, "a")
    b = await store.sessions.fork("a", 4, new_key="b")
    b.add_message("user", "b4")
    await store.sessions.save(b)
    c = await store.sessions.fork("b", 5, new_key="c")
    c.add_message("user", "c5")
    await store.sessions.save(c)
    assert await store.sessions.delete("b")
    c2 = await fresh(store, "c")
    assert contents(c2.messages) == ["a0", "a1", "a2", "a3", "b4", "c5"]
    assert c2.parent == ("a", 4)  # it now holds b's part itself and reads the rest from a
    assert await store.sessions.branches("a") == [statekeel.Branch("c", 4, 6, c2.created_at)]
    assert await store.sessions.delete("a")
    c3 = await fresh(store, "c")
    assert contents(c3.messages) == ["a0", "a1", "a2", "a3", "b4", "c5"] and c3.parent is None
    assert await view(store, "c") == ["a0", "a1", "a2", "a3", "b4", "c5"]
    c3.add_message("user", "c6")
    await store.sessions.save(c3)
    assert contents((await fresh(store, "c")).messages)[-1] == "c6"


async def test_deleting_a_compressed_parent_keeps_its_forks_whole(store: statekeel.Store) -> None:
    await make(store, "p", 6)
    await store.sessions.fork("p", 5, new_key="f")
    await store.sessions.compress("p", 3, "first three")
    await store.sessions.delete("p")
    assert contents((await fresh(store, "f")).messages) == [f"m{i}" for i in range(5)]


async def test_deleting_a_parent_of_a_compressed_fork_copies_only_what_it_lacks(
    store: statekeel.Store,
) -> None:
    await make(store, "p", 6)
    f = await store.sessions.fork("p", 5, new_key="f")
    f.add_message("user", "f5")
    await store.sessions.save(f)
    await store.sessions.compress("f", 2, "first two")
    await store.sessions.delete("p")
    f2 = await fresh(store, "f", include_archived=True)
    assert contents(f2.messages) == ["m0", "m1", "m2", "m3", "m4", "f5"]
    assert await view(store, "f") == ["m0", "m1", "m2", "m3", "m4", "f5"]


async def test_purging_an_archived_parent_keeps_its_forks_whole(store: statekeel.Store) -> None:
    await make(store, "p", 4)
    f = await store.sessions.fork("p", 3, new_key="f")
    f.add_message("user", "f3")
    await store.sessions.save(f)
    await store.sessions.archive("p")
    report = await store.purge(now=dt.datetime.now(dt.UTC) + dt.timedelta(days=3650))
    assert report.sessions == 1
    assert await store.sessions.load("p") is None
    f2 = await fresh(store, "f")
    assert contents(f2.messages) == ["m0", "m1", "m2", "f3"] and f2.parent is None


async def test_expiring_or_archiving_a_parent_changes_nothing_for_its_forks(store: statekeel.Store) -> None:
    await make(store, "p", 4)
    f = await store.sessions.fork("p", 3, new_key="f")
    f.add_message("user", "f3")
    await store.sessions.save(f)
    await store.sessions.expire("p")
    assert (await fresh(store, "f")).parent == ("p", 3)
    await store.sessions.archive("p")
    f2 = await fresh(store, "f")
    assert contents(f2.messages) == ["m0", "m1", "m2", "f3"] and f2.parent == ("p", 3)
    assert [b.key for b in await store.sessions.branches("p")] == ["f"]
    f2.add_message("user", "f4")
    await store.sessions.save(f2)
    assert await view(store, "f") == ["m0", "m1", "m2", "f3", "f4"]


async def test_a_dry_run_purge_leaves_the_fork_pointing_at_its_parent(store: statekeel.Store) -> None:
    await make(store, "p", 2)
    await store.sessions.fork("p", 2, new_key="f")
    await store.sessions.archive("p")
    await store.purge(now=dt.datetime.now(dt.UTC) + dt.timedelta(days=3650), dry_run=True)
    assert (await fresh(store, "f")).parent == ("p", 2)


async def test_an_encrypted_fork_opens_its_parents_messages(store_url: str, tmp_path: Any) -> None:
    if not store_url.startswith("sqlite"):
        pytest.skip("encryption is covered on SQLite here; the sealing code is shared")
    key = bytes(range(32))
    async with statekeel.open_store(store_url, encryption_key=key) as s:
        await make(s, "p", 3)
        f = await s.sessions.fork("p", 2, new_key="f")
        assert contents(f.messages) == ["m0", "m1"]
        await s.sessions.delete("p")
        assert contents((await fresh(s, "f")).messages) == ["m0", "m1"]


CALL = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}


async def test_a_fork_left_with_waiting_calls_by_a_process_that_is_gone_is_repaired(
    store_url: str, tmp_path: Any
) -> None:
    if store_url == "memory://":
        pytest.skip("needs a second store on the same database")
    async with statekeel.open_store(store_url, fallback_dir=str(tmp_path / "a")) as creator:
        s = await creator.sessions.get_or_create("p")
        s.add_message("user", "run it")
        s.add_message("assistant", None, tool_calls=[CALL])
        await creator.sessions.save(s)
        f = await creator.sessions.fork("p", 2, new_key="f")
        g = await creator.sessions.fork("p", 2, new_key="g")
        # Its creator is alive: the call it inherited is its to answer.
        assert [c.call_id for c in f.pending_calls()] == ["c1"] and f.repaired == ()
        assert g.repaired == ()
    async with statekeel.open_store(store_url, fallback_dir=str(tmp_path / "b")) as later:
        report = await later.recover()  # finds the forks through their own rows, reads what they inherited
        assert report.orphaned_tool_calls.get("f") == ["c1"] and report.orphaned_tool_calls.get("g") == ["c1"]
        f2 = await fresh(later, "f")
        assert f2.pending_calls() == [] and len(f2.messages) == 3 and f2.messages[2]["tool_call_id"] == "c1"
        # The parent's history is its own: answered once, in its own transcript, not through the fork.
        p = await fresh(later, "p")
        assert len(p.messages) == 3
        assert await view(later, "f") == ["run it", None, f2.messages[2]["content"]]


@pytest.mark.parametrize("started_only", [False, True])
async def test_a_fork_between_a_tool_call_that_ran_and_its_result_holds_the_call_in_doubt_never_not_run(
    store_url: str, tmp_path: Any, started_only: bool
) -> None:
    if store_url == "memory://":
        pytest.skip("needs a second store on the same database")
    async with statekeel.open_store(store_url, fallback_dir=str(tmp_path / "a")) as creator:
        s = await creator.sessions.get_or_create("p")
        s.add_message("user", "charge the card")
        s.add_message("assistant", None, tool_calls=[CALL])
        await creator.sessions.save(s)
        if started_only:  # the process died while the tool ran: its journal row says started
            await creator.backend.start_session_step("p", "c1", owner="gone-process", expected_attempt=None)
        else:
            assert await creator.sessions.run_tool(s, "c1", lambda: "charged 3 EUR") == "charged 3 EUR"
        await creator.sessions.fork("p", 2, new_key="f")  # the fork's history stops before the result
    async with statekeel.open_store(store_url, fallback_dir=str(tmp_path / "b")) as later:
        report = await later.recover()
        # Not "interrupted: the agent stopped before this tool call returned": it ran (or may have).
        assert "f" not in report.orphaned_tool_calls
        f = await fresh(later, "f")
        assert f.repaired == () and [c.call_id for c in f.pending_calls()] == ["c1"]
        assert await view(later, "f") == ["charge the card", None]
        ran: list[int] = []
        with pytest.raises(statekeel.StepInDoubt):
            await later.sessions.run_tool(f, "c1", lambda: ran.append(1))
        assert ran == []  # never run a second time through the fork
        p = await fresh(later, "p")
        assert len(p.messages) == (2 if started_only else 3)


# --- a fork's parent is current in the process that changed it (the fork is cached there) ---------------


async def _cached_fork(store: statekeel.Store) -> statekeel.Session:
    await make(store, "p", 6)
    f = await store.sessions.fork("p", 5, new_key="f")
    f.add_message("user", "f5")
    await store.sessions.save(f)
    assert store.sessions.cached("f") is f and f.parent == ("p", 5)
    return f


async def test_a_cached_fork_shows_its_new_fork_point_after_its_parent_is_rewound_below_it(
    store: statekeel.Store,
) -> None:
    await _cached_fork(store)
    await store.sessions.rewind("p", 3, reason="undo")
    loaded = await store.sessions.load("f")
    assert loaded is not None and loaded.parent == ("p", 3)
    assert contents(loaded.messages) == ["m0", "m1", "m2", "m3", "m4", "f5"]
    assert loaded.parent == (await fresh(store, "f")).parent


async def test_a_cached_fork_shows_no_parent_after_its_parent_is_deleted(store: statekeel.Store) -> None:
    await _cached_fork(store)
    assert await store.sessions.delete("p")
    loaded = await store.sessions.load("f")
    assert loaded is not None and loaded.parent is None
    assert contents(loaded.messages) == ["m0", "m1", "m2", "m3", "m4", "f5"]


async def test_a_cached_fork_shows_its_grandparent_after_its_parent_is_purged(store: statekeel.Store) -> None:
    await make(store, "a", 3, "a")
    p = await store.sessions.fork("a", 2, new_key="p")
    p.add_message("user", "p2")
    await store.sessions.save(p)
    f = await store.sessions.fork("p", 3, new_key="f")
    f.add_message("user", "f3")
    await store.sessions.save(f)
    assert store.sessions.cached("f") is f and f.parent == ("p", 3)
    await store.sessions.archive("p")
    report = await store.purge(now=dt.datetime.now(dt.UTC) + dt.timedelta(days=3650))
    assert report.sessions == 1
    loaded = await store.sessions.load("f")
    assert loaded is not None and loaded.parent == ("a", 2)
    assert contents(loaded.messages) == ["a0", "a1", "p2", "f3"]
