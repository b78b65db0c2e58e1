"""Long histories on every backend: a session of many hundred messages loads whole and in order after
every change that touches its older messages (compression, rewind, fork, key rotation, erasure, a rolled
back block). SQLite packs runs of 256 messages older than the live tail into sealed segments
(backends/sql/segments.py); the tests at the end check those rows themselves: written with the append
that sealed them, dropped with any row they cover, sealed again later, and refused when damaged."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import statekeel
from statekeel.backends.sql.segments import LIVE_TAIL, SEGMENT
from statekeel.errors import StorageCorrupt

KEY = bytes(range(32))
OTHER_KEY = bytes(range(100, 132))
SECRET = "PLAINTEXT-MARKER-"


async def grow(store: statekeel.Store, key: str, n: int, *, prefix: str = "m", per_save: int = 4) -> None:
    """Append ``n`` messages to ``key`` (created if missing), ``per_save`` per save, as an agent's turns."""
    s = await store.sessions.get_or_create(key)
    start = s.head_seq
    for i in range(start, start + n):
        s.add_message("user" if i % 2 == 0 else "assistant", f"{prefix}{i}", turn=i // 4)
        if (i + 1 - start) % per_save == 0:
            await store.sessions.save(s)
    await store.sessions.save(s)


async def fresh(store: statekeel.Store, key: str, **kw: Any) -> list[Any]:
    """The contents of the session as the backend loads it (not the cached object)."""
    store.sessions._cache.pop(key, None)
    s = await store.sessions.load(key, **kw)
    assert s is not None
    return [m["content"] for m in s.messages]


async def rows(store: statekeel.Store, key: str) -> list[Any]:
    """The same history read row by row, checking the seqs are dense."""
    found = await store.backend.load_session_with_messages(key, include_archived=True)
    assert found is not None
    record, messages = found
    assert [m.seq for m in messages] == list(range(record.head_seq))
    return [m.payload["content"] for m in messages]


def names(lo: int, hi: int, prefix: str = "m") -> list[str]:
    return [f"{prefix}{i}" for i in range(lo, hi)]


N = 3 * SEGMENT + LIVE_TAIL + 37  # three runs sealed, a live tail, and a partial run


async def test_a_long_history_loads_whole_and_in_order(store: statekeel.Store) -> None:
    await grow(store, "s", N)
    assert await fresh(store, "s") == names(0, N) == await rows(store, "s")
    s = await store.sessions.load("s")
    assert s is not None and s.messages[SEGMENT]["turn"] == SEGMENT // 4  # every field kept


async def test_messages_saved_one_at_a_time_and_in_one_save_load_alike(store: statekeel.Store) -> None:
    await grow(store, "one", N, per_save=1)
    await grow(store, "all", N, per_save=N)
    assert await fresh(store, "one") == names(0, N) == await fresh(store, "all")


async def test_a_rewind_into_older_messages_loads_the_rest_and_the_new_ones(store: statekeel.Store) -> None:
    await grow(store, "s", N)
    to = SEGMENT + 10  # inside the second run
    await store.sessions.rewind("s", to, reason="retry")
    assert await fresh(store, "s") == names(0, to)
    await grow(store, "s", N - to, prefix="n")
    expected = names(0, to) + [f"n{i}" for i in range(to, N)]
    assert await fresh(store, "s") == expected == (await rows(store, "s"))[:to] + expected[to:]


async def test_compression_of_older_messages_loads_from_where_it_stopped(store: statekeel.Store) -> None:
    await grow(store, "s", N)
    upto = SEGMENT + SEGMENT // 2  # half of the second run moves to the archive
    await store.sessions.compress("s", upto, "the first turns")
    assert await fresh(store, "s") == names(upto, N)
    assert await fresh(store, "s", include_archived=True) == names(0, N)
    await grow(store, "s", 2 * SEGMENT)
    assert await fresh(store, "s") == names(upto, N + 2 * SEGMENT)


async def test_a_fork_of_a_long_history_reads_its_parent_then_its_own(store: statekeel.Store) -> None:
    await grow(store, "p", N)
    at = 2 * SEGMENT + 5
    fork = await store.sessions.fork("p", at, new_key="f")
    assert [m["content"] for m in fork.messages] == names(0, at)
    await grow(store, "f", 3 * SEGMENT, prefix="f")
    await grow(store, "p", SEGMENT, prefix="m")
    assert await fresh(store, "f") == names(0, at) + [f"f{i}" for i in range(at, at + 3 * SEGMENT)]
    assert await fresh(store, "p") == names(0, N + SEGMENT)


async def test_a_rolled_back_block_leaves_the_history_as_it_was(store: statekeel.Store) -> None:
    await grow(store, "s", SEGMENT + LIVE_TAIL - 4)  # the next turn seals the first run
    before = await fresh(store, "s")
    s = await store.sessions.load("s")
    assert s is not None
    with pytest.raises(RuntimeError, match="abort"):
        async with store.backend.atomic():
            for i in range(8):
                s.add_message("user", f"x{i}")
            await store.sessions.save(s)
            raise RuntimeError("abort")
    assert await fresh(store, "s") == before
    await grow(store, "s", SEGMENT)
    assert await fresh(store, "s") == names(0, 2 * SEGMENT + LIVE_TAIL - 4)


async def test_a_deleted_session_made_again_holds_only_its_new_messages(store: statekeel.Store) -> None:
    await grow(store, "s", N)
    assert await store.sessions.delete("s")
    await grow(store, "s", SEGMENT + LIVE_TAIL + 8, prefix="again")
    assert await fresh(store, "s") == names(0, SEGMENT + LIVE_TAIL + 8, "again")


# --- the segments themselves, on SQLite -----------------------------------------------------------


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


def segments(tmp_path: Path, key: str | None = None) -> list[tuple[str, int, int]]:
    conn = sqlite3.connect(tmp_path / "store.db")
    try:
        found = conn.execute(
            "SELECT session_key, first_seq, upto_seq FROM message_segments ORDER BY session_key, first_seq"
        ).fetchall()
    finally:
        conn.close()
    return [r for r in found if key is None or r[0] == key]


def runs(key: str, *firsts: int) -> list[tuple[str, int, int]]:
    return [(key, f, f + SEGMENT) for f in firsts]


def segments_match_rows(tmp_path: Path) -> None:
    """Every segment holds exactly the payloads of the rows it covers, in order."""
    conn = sqlite3.connect(tmp_path / "store.db")
    try:
        for key, first, upto, packed in conn.execute(
            "SELECT session_key, first_seq, upto_seq, payloads FROM message_segments"
        ):
            stored = [
                r[0]
                for r in conn.execute(
                    "SELECT payload FROM messages WHERE session_key = ? AND seq >= ? AND seq < ? "
                    "ORDER BY seq",
                    (key, first, upto),
                )
            ]
            assert packed == "[" + ",".join(stored) + "]", (key, first)
    finally:
        conn.close()


async def test_a_run_is_sealed_by_the_append_that_leaves_it_behind_the_live_tail(tmp_path: Path) -> None:
    async with statekeel.open_store(sqlite_url(tmp_path)) as store:
        await grow(store, "s", SEGMENT + LIVE_TAIL - 1, per_save=1)
        assert segments(tmp_path) == []
        await grow(store, "s", 1, per_save=1)
        assert segments(tmp_path) == runs("s", 0)
        await grow(store, "s", 2 * SEGMENT)
        assert segments(tmp_path) == runs("s", 0, SEGMENT, 2 * SEGMENT)
    segments_match_rows(tmp_path)


async def test_what_drops_older_rows_drops_their_segments_and_a_later_save_seals_them_again(
    tmp_path: Path,
) -> None:
    async with statekeel.open_store(sqlite_url(tmp_path)) as store:
        await grow(store, "s", N)
        assert segments(tmp_path) == runs("s", 0, SEGMENT, 2 * SEGMENT)
        await store.sessions.rewind("s", SEGMENT + 10, reason="retry")
        assert segments(tmp_path) == runs("s", 0)  # the second and third runs lost rows
        await grow(store, "s", N - SEGMENT - 10, prefix="n")
        assert segments(tmp_path) == runs("s", 0, SEGMENT, 2 * SEGMENT)
        segments_match_rows(tmp_path)
        await store.sessions.compress("s", SEGMENT // 2, "first turns")
        assert segments(tmp_path) == runs("s", SEGMENT, 2 * SEGMENT)
        assert (await fresh(store, "s"))[:2] == [f"m{SEGMENT // 2}", f"m{SEGMENT // 2 + 1}"]
        assert await store.sessions.delete("s")
        assert segments(tmp_path) == []
    segments_match_rows(tmp_path)


async def test_key_rotation_drops_the_segments_it_reseals_and_a_later_save_seals_them_again(
    tmp_path: Path,
) -> None:
    url = sqlite_url(tmp_path)
    async with statekeel.open_store(url, encryption_key=KEY) as store:
        await grow(store, "s", N, prefix=SECRET)
        assert segments(tmp_path) == runs("s", 0, SEGMENT, 2 * SEGMENT)
        assert await fresh(store, "s") == names(0, N, SECRET)
    async with statekeel.open_store(url, encryption_key=[OTHER_KEY, KEY]) as store:
        await store.rotate_encryption_key()
        assert segments(tmp_path) == []
        assert await fresh(store, "s") == names(0, N, SECRET)
    async with statekeel.open_store(url, encryption_key=OTHER_KEY) as store:
        await grow(store, "s", SEGMENT, prefix=SECRET)
        assert segments(tmp_path) == runs("s", 0, SEGMENT, 2 * SEGMENT, 3 * SEGMENT)
        assert await fresh(store, "s") == names(0, N + SEGMENT, SECRET)
    segments_match_rows(tmp_path)
    conn = sqlite3.connect(tmp_path / "store.db")
    try:
        packed = "".join(r[0] for r in conn.execute("SELECT payloads FROM message_segments"))
    finally:
        conn.close()
    assert SECRET not in packed  # sealed payloads, not plaintext


async def test_erasing_a_session_leaves_no_segment_of_it(tmp_path: Path) -> None:
    async with statekeel.open_store(sqlite_url(tmp_path)) as store:
        await grow(store, "gone", N)
        await grow(store, "kept", N)
        await store.erase("gone", actor="dpo", reason="request #1")
        assert segments(tmp_path) == runs("kept", 0, SEGMENT, 2 * SEGMENT)
        assert await fresh(store, "kept") == names(0, N)


async def test_a_damaged_segment_is_storage_corrupt_not_a_shorter_history(tmp_path: Path) -> None:
    async with statekeel.open_store(sqlite_url(tmp_path)) as store:
        await grow(store, "s", N)
    conn = sqlite3.connect(tmp_path / "store.db")
    try:
        # Behind statekeel's back, as a broken disk or tool would: the segment loses its last element.
        conn.execute(
            "UPDATE message_segments SET payloads = json_remove(payloads, '$[#-1]') WHERE first_seq = ?",
            (SEGMENT,),
        )
        conn.commit()
    finally:
        conn.close()
    async with statekeel.open_store(sqlite_url(tmp_path)) as store:
        with pytest.raises(StorageCorrupt, match=f"messages {SEGMENT}..{2 * SEGMENT - 1}"):
            await fresh(store, "s")
        assert await rows(store, "s") == names(0, N)  # the rows, the truth, are intact


def test_a_writer_killed_mid_history_leaves_segments_that_match_their_rows(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    child = textwrap.dedent(
        f"""
        import asyncio, sys, statekeel
        async def main():
            async with statekeel.open_store({url!r}, durability="full") as store:
                s = await store.sessions.get_or_create("s")
                for i in range(100_000):
                    for j in range(3):
                        s.add_message("user", f"m{{3 * i + j}}")
                    await store.sessions.save(s)
                    if s.head_seq >= {2 * SEGMENT + LIVE_TAIL} and i % 7 == 0:
                        print(s.head_seq, flush=True)
        asyncio.run(main())
        """
    )
    acked = 0
    command = [sys.executable, "-c", child]
    with subprocess.Popen(command, stdout=subprocess.PIPE, env=os.environ.copy()) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:  # kill it mid-run, after some runs were sealed, between any two statements
            acked = int(line)
            if acked >= 4 * SEGMENT + LIVE_TAIL:
                break
        proc.kill()
    segments_match_rows(tmp_path)
    sealed = segments(tmp_path)
    assert sealed[:4] == runs("s", 0, SEGMENT, 2 * SEGMENT, 3 * SEGMENT)

    async def reopened() -> list[Any]:
        async with statekeel.open_store(url) as store:
            got = await fresh(store, "s")
            assert got == await rows(store, "s")
            return got

    got = asyncio.run(reopened())
    assert len(got) >= acked and got == names(0, len(got))


async def test_two_stores_racing_across_runs_keep_segments_that_match_their_rows(tmp_path: Path) -> None:
    # Two stores on one file load the same head and both append, every turn: the second save is refused
    # (ConflictError) and written again after a reload. Turns cross run boundaries on both sides, so both
    # the winner's seal and the loser's refused append happen at a crossing.
    url = sqlite_url(tmp_path)
    async with statekeel.open_store(url) as a, statekeel.open_store(url) as b:
        await grow(a, "s", 4)
        acked = names(0, 4)
        turns = 3 * SEGMENT // 8
        for i in range(turns):
            first, second = (a, b) if i % 2 == 0 else (b, a)
            for store in (a, b):
                store.sessions._cache.pop("s", None)
            s1 = await first.sessions.get_or_create("s")
            s2 = await second.sessions.get_or_create("s")
            assert s1.head_seq == s2.head_seq
            for side, s in (("w", s1), ("l", s2)):
                for j in range(4):
                    s.add_message("user", f"{side}{i}.{j}")
            await first.sessions.save(s1)
            acked += [f"w{i}.{j}" for j in range(4)]
            with pytest.raises(statekeel.ConflictError):
                await second.sessions.save(s2)
            second.sessions._cache.pop("s", None)
            again = await second.sessions.get_or_create("s")
            for j in range(4):
                again.add_message("user", f"r{i}.{j}")
            await second.sessions.save(again)
            acked += [f"r{i}.{j}" for j in range(4)]
        loaded = await fresh(b, "s")
        assert loaded == await rows(b, "s") == acked
    segments_match_rows(tmp_path)
    assert segments(tmp_path) == runs("s", *range(0, sealable(len(acked)), SEGMENT))


def sealable(head: int) -> int:
    return max(head - LIVE_TAIL, 0) // SEGMENT * SEGMENT
