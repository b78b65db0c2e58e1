"""The session part of the storage contract, on every backend, including operations run concurrently
inside one ``atomic()`` block."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

import statekeel
from helpers import message

pytestmark = pytest.mark.kinds("sessions")


async def test_append_assigns_dense_sequence_numbers(store: statekeel.Store) -> None:
    b = store.backend
    rec = await b.append_messages(
        "s", 0, [message(store, "a"), message(store, "b", "assistant")], create=True
    )
    assert rec.head_seq == 2
    rec = await b.append_messages("s", 2, [message(store, "c")])
    assert rec.head_seq == 3
    rows = await b.read_messages("s")
    assert [(r.seq, r.payload["content"]) for r in rows] == [(0, "a"), (1, "b"), (2, "c")]


async def test_append_at_stale_head_raises_conflict_with_current_head(store: statekeel.Store) -> None:
    b = store.backend
    await b.append_messages("s", 0, [message(store, "a")], create=True)
    with pytest.raises(statekeel.ConflictError) as info:
        await b.append_messages("s", 0, [message(store, "b")])
    assert info.value.current == 1
    assert [r.payload["content"] for r in await b.read_messages("s")] == ["a"]


async def _fill(store: statekeel.Store, key: str, n: int, *, start: int = 0) -> None:
    await store.backend.append_messages(
        key, start, [message(store, f"m{start + i}") for i in range(n)], create=start == 0
    )


def _contents(rows: list[Any]) -> list[str]:
    return [r.payload["content"] for r in rows]


async def _list_all(store: statekeel.Store, *, limit: int, status: str | None = None) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        page = await store.backend.list_sessions(status=status, limit=limit, cursor=cursor)
        pages.append([r.key for r in page.items])
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor
        assert len(pages) < 100, "pagination does not terminate"


async def test_create_session_returns_an_empty_active_session(store: statekeel.Store) -> None:
    rec = await store.backend.create_session("s", metadata=store.codec.encode({"owner": "me"}))
    assert (rec.key, rec.status, rec.head_seq, rec.last_consolidated) == ("s", "active", 0, 0)
    assert rec.metadata == {"owner": "me"}
    loaded = await store.backend.load_session("s")
    assert loaded == rec


async def test_create_existing_session_conflicts_unless_if_missing(store: statekeel.Store) -> None:
    first = await store.backend.create_session("s")
    with pytest.raises(statekeel.ConflictError):
        await store.backend.create_session("s")
    assert await store.backend.create_session("s", if_missing=True) == first


async def test_load_of_a_missing_session_is_none(store: statekeel.Store) -> None:
    assert await store.backend.load_session("nope") is None
    assert await store.backend.load_session_with_messages("nope") is None


async def test_append_to_a_missing_session_without_create_is_not_found(store: statekeel.Store) -> None:
    with pytest.raises(statekeel.NotFound):
        await store.backend.append_messages("nope", 0, [message(store, "a")])
    assert await store.backend.load_session("nope") is None


async def test_list_returns_sessions_newest_first_across_pages_without_gaps_or_duplicates(
    store: statekeel.Store,
) -> None:
    keys = [f"k{i:02d}" for i in range(23)]
    for key in keys:
        await store.backend.create_session(key)
    # Touch a few old ones: they become the newest.
    for key in ("k03", "k00", "k11"):
        rec = await store.backend.load_session(key)
        assert rec is not None
        await store.backend.append_messages(key, 0, [message(store, "x")])
    records = [await store.backend.load_session(k) for k in keys]
    expected = [
        r.key for r in sorted(records, key=lambda r: (r.updated_at, r.key), reverse=True) if r is not None
    ]
    assert expected[:3] == ["k11", "k00", "k03"]
    pages = await _list_all(store, limit=5)
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    assert [k for p in pages for k in p] == expected
    single = await _list_all(store, limit=100)
    assert single == [expected]


async def test_list_page_of_exact_size_has_no_next_cursor(store: statekeel.Store) -> None:
    for key in ("a", "b", "c"):
        await store.backend.create_session(key)
    page = await store.backend.list_sessions(limit=3)
    assert len(page.items) == 3
    assert page.next_cursor is None


async def test_list_filters_by_status(store: statekeel.Store) -> None:
    for i in range(7):
        await store.backend.create_session(f"s{i}")
    for key in ("s1", "s4", "s5"):
        await store.backend.update_session(key, status="expired")
    expired = [k for p in await _list_all(store, limit=2, status="expired") for k in p]
    assert sorted(expired) == ["s1", "s4", "s5"]
    active = [k for p in await _list_all(store, limit=2, status="active") for k in p]
    assert sorted(active) == ["s0", "s2", "s3", "s6"]
    assert (await store.backend.list_sessions(status="archived")).items == []


@pytest.mark.parametrize("cursor", ["garbage", "", "bm90IGpzb24=", "WzEsMiwzXQ==", "!!!"])
async def test_list_with_a_cursor_it_did_not_return_is_invalid_argument(
    store: statekeel.Store, cursor: str
) -> None:
    await store.backend.create_session("s")
    with pytest.raises(statekeel.InvalidArgument):
        await store.backend.list_sessions(cursor=cursor)
    assert len((await store.backend.list_sessions()).items) == 1


async def test_update_session_with_expected_version_changes_metadata_and_status(
    store: statekeel.Store,
) -> None:
    rec = await store.backend.create_session("s")
    new = await store.backend.update_session(
        "s", expected_version=rec.version, metadata=store.codec.encode({"a": 1}), status="expired"
    )
    assert new.version == rec.version + 1
    assert (new.metadata, new.status) == ({"a": 1}, "expired")
    assert new.updated_at >= rec.updated_at
    assert await store.backend.load_session("s") == new


async def test_update_session_at_stale_version_raises_conflict_with_current_and_changes_nothing(
    store: statekeel.Store,
) -> None:
    rec = await store.backend.create_session("s", metadata=store.codec.encode({"a": 1}))
    await store.backend.update_session(
        "s", expected_version=rec.version, metadata=store.codec.encode({"a": 2})
    )
    before = await store.backend.load_session("s")
    assert before is not None
    with pytest.raises(statekeel.ConflictError) as info:
        await store.backend.update_session(
            "s", expected_version=rec.version, metadata=store.codec.encode({"a": 3}), status="archived"
        )
    assert info.value.current == before.version
    assert await store.backend.load_session("s") == before


async def test_append_messages_rejects_a_naive_expected_created_at(store: statekeel.Store) -> None:
    s = await store.sessions.get_or_create("k")
    s.add_message("user", "x")
    await store.sessions.save(s)
    with pytest.raises(statekeel.InvalidArgument, match="expected_created_at"):
        await store.backend.append_messages("k", 1, [], expected_created_at=dt.datetime(2026, 1, 1))


async def test_update_of_a_missing_session_is_not_found(store: statekeel.Store) -> None:
    with pytest.raises(statekeel.NotFound):
        await store.backend.update_session("nope", status="expired")


async def test_delete_session_removes_messages_archive_and_summaries(store: statekeel.Store) -> None:
    b = store.backend
    await _fill(store, "s", 6)
    await b.archive_messages("s", compression_id="c1", upto_seq=3, summary="first", expected_consolidated=0)
    await _fill(store, "other", 2)
    assert await b.delete_session("s") is True
    assert await b.load_session("s") is None
    assert await b.read_messages("s") == []
    assert await b.read_archive("s") == []
    assert await b.read_summaries("s") == []
    assert await b.delete_session("s") is False
    # The key starts over from scratch: no leftover message or archive row collides with seq 0.
    await _fill(store, "s", 2)
    await b.archive_messages("s", compression_id="c1", upto_seq=1, summary="again", expected_consolidated=0)
    assert [a.payload["content"] for a in await b.read_archive("s")] == ["m0"]
    assert _contents(await b.read_messages("other")) == ["m0", "m1"]


async def test_read_messages_by_range_and_tail(store: statekeel.Store) -> None:
    b = store.backend
    await _fill(store, "s", 10)
    assert [r.seq for r in await b.read_messages("s", start=3, end=6)] == [3, 4, 5]
    assert [r.seq for r in await b.read_messages("s", start=8)] == [8, 9]
    assert await b.read_messages("s", start=10) == []
    assert await b.read_messages("s", start=5, end=5) == []
    assert _contents(await b.tail_messages("s", 3)) == ["m7", "m8", "m9"]
    assert [r.seq for r in await b.tail_messages("s", 50)] == list(range(10))
    assert await b.tail_messages("s", 0) == []
    rows = await b.read_messages("s")
    assert [r.role for r in rows] == ["user"] * 10
    assert all(r.session_key == "s" for r in rows)


async def test_archive_moves_messages_and_advances_last_consolidated_together(store: statekeel.Store) -> None:
    b = store.backend
    await _fill(store, "s", 6)
    rec = await b.archive_messages(
        "s", compression_id="c1", upto_seq=4, summary="sum1", expected_consolidated=0
    )
    assert (rec.last_consolidated, rec.head_seq) == (4, 6)
    assert [r.seq for r in await b.read_messages("s")] == [4, 5]
    archived = await b.read_archive("s")
    assert [(a.seq, a.payload["content"], a.compression_id, a.summary) for a in archived] == [
        (i, f"m{i}", "c1", "sum1") for i in range(4)
    ]
    found = await b.load_session_with_messages("s")
    assert found is not None
    assert found[0].last_consolidated == 4
    assert [m.seq for m in found[1]] == [4, 5]
    assert await b.read_summaries("s") == [("c1", 0, 4, "sum1")]
    # Appending continues at the head, not at the number of live messages.
    rec = await b.append_messages("s", 6, [message(store, "m6")])
    assert rec.head_seq == 7


async def test_read_archive_is_in_sequence_order_and_filters_by_compression(store: statekeel.Store) -> None:
    b = store.backend
    await _fill(store, "s", 9)
    await b.archive_messages("s", compression_id="zz", upto_seq=3, summary="one", expected_consolidated=0)
    await b.archive_messages("s", compression_id="aa", upto_seq=7, summary="two", expected_consolidated=3)
    assert [(a.seq, a.compression_id) for a in await b.read_archive("s")] == [
        (0, "zz"), (1, "zz"), (2, "zz"), (3, "aa"), (4, "aa"), (5, "aa"), (6, "aa"),
    ]  # fmt: skip
    assert [a.seq for a in await b.read_archive("s", compression_id="aa")] == [3, 4, 5, 6]
    assert await b.read_archive("s", compression_id="missing") == []
    assert await b.read_summaries("s") == [("zz", 0, 3, "one"), ("aa", 3, 7, "two")]


async def _snapshot(store: statekeel.Store, key: str) -> tuple[Any, ...]:
    b = store.backend
    return (
        await b.load_session(key),
        await b.read_messages(key),
        await b.read_archive(key),
        await b.read_summaries(key),
    )


async def test_archive_at_stale_consolidation_conflicts_and_changes_nothing(store: statekeel.Store) -> None:
    b = store.backend
    await _fill(store, "s", 6)
    await b.archive_messages("s", compression_id="c1", upto_seq=2, summary="s", expected_consolidated=0)
    before = await _snapshot(store, "s")
    with pytest.raises(statekeel.ConflictError) as info:
        await b.archive_messages("s", compression_id="c2", upto_seq=5, summary="s", expected_consolidated=0)
    assert info.value.current == 2
    assert await _snapshot(store, "s") == before


@pytest.mark.parametrize("upto", [0, 2, 7, -1])
async def test_archive_of_a_bad_range_is_refused_and_changes_nothing(
    store: statekeel.Store, upto: int
) -> None:
    b = store.backend
    await _fill(store, "s", 6)
    await b.archive_messages("s", compression_id="c1", upto_seq=2, summary="s", expected_consolidated=0)
    before = await _snapshot(store, "s")
    with pytest.raises(statekeel.InvalidArgument):
        await b.archive_messages(
            "s", compression_id="c2", upto_seq=upto, summary="s", expected_consolidated=2
        )
    assert await _snapshot(store, "s") == before


async def test_archive_reusing_a_compression_id_fails_and_changes_nothing(store: statekeel.Store) -> None:
    b = store.backend
    await _fill(store, "s", 6)
    await b.archive_messages("s", compression_id="c1", upto_seq=2, summary="s", expected_consolidated=0)
    before = await _snapshot(store, "s")
    with pytest.raises(statekeel.StatekeelError):
        await b.archive_messages("s", compression_id="c1", upto_seq=4, summary="s", expected_consolidated=2)
    assert await _snapshot(store, "s") == before


async def test_archive_of_a_missing_session_is_not_found(store: statekeel.Store) -> None:
    with pytest.raises(statekeel.NotFound):
        await store.backend.archive_messages(
            "nope", compression_id="c", upto_seq=1, summary="s", expected_consolidated=0
        )


@pytest.mark.kinds("sessions", "transactions")
async def test_failed_append_inside_atomic_leaves_earlier_state_intact(store: statekeel.Store) -> None:
    b = store.backend
    await _fill(store, "s", 2)
    with pytest.raises(statekeel.ConflictError):
        async with b.atomic():
            await b.append_messages("s", 2, [message(store, "m2")])
            await b.append_messages("s", 2, [message(store, "dup")])
    assert _contents(await b.read_messages("s")) == ["m0", "m1"]
    rec = await b.load_session("s")
    assert rec is not None and rec.head_seq == 2


# Child tasks started inside ``atomic()`` inherit the block: their operations join its transaction (on
# PostgreSQL one connection, which asyncpg lets run one operation at a time).
@pytest.mark.kinds("sessions", "transactions")
async def test_concurrent_operations_inside_one_atomic_block_all_commit_together(
    store: statekeel.Store,
) -> None:
    b = store.backend
    async with b.atomic():
        await asyncio.gather(
            *(b.append_messages(f"s{i}", 0, [message(store, f"m{i}")], create=True) for i in range(8))
        )
    for i in range(8):
        assert [r.payload["content"] for r in await b.read_messages(f"s{i}")] == [f"m{i}"]


@pytest.mark.kinds("sessions", "transactions")
async def test_concurrent_operations_inside_an_atomic_block_that_fails_all_roll_back(
    store: statekeel.Store,
) -> None:
    b = store.backend

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with b.atomic():
            await asyncio.gather(
                *(b.append_messages(f"s{i}", 0, [message(store, f"m{i}")], create=True) for i in range(8))
            )
            raise Boom
    for i in range(8):
        assert await b.load_session(f"s{i}") is None


@pytest.mark.postgres
async def test_postgres_archive_locks_the_session_row_it_checked(
    pg_migrated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncpg

    from statekeel.backends.postgres.backend import PgTx

    async with statekeel.open_store(pg_migrated) as store:
        b = store.backend
        await _fill(store, "s", 4)
        checked, resume = asyncio.Event(), asyncio.Event()
        fetchone = PgTx.fetchone

        async def pause_after_the_first_row_read(self: PgTx, name: str, *args: Any) -> Any:
            row = await fetchone(self, name, *args)
            if not checked.is_set():
                checked.set()  # the archive has read (and checked) the session row
                await resume.wait()
            return row

        monkeypatch.setattr(PgTx, "fetchone", pause_after_the_first_row_read)
        archive = asyncio.create_task(
            b.archive_messages("s", compression_id="c1", upto_seq=3, summary="old", expected_consolidated=0)
        )
        await checked.wait()
        monkeypatch.undo()

        async def delete_and_create_again() -> None:
            await b.delete_session("s")
            await b.append_messages("s", 0, [message(store, f"new-{i}") for i in range(4)], create=True)

        recreate = asyncio.create_task(delete_and_create_again())
        watcher = await asyncpg.connect(pg_migrated)
        try:
            async with asyncio.timeout(10):  # until it is done, or waits for the row the archive locked
                while not recreate.done() and not await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                ):
                    await asyncio.sleep(0.01)
        finally:
            await watcher.close()
        resume.set()
        await archive  # the old session's compression, applied to the old session
        await recreate
        record = await b.load_session("s")
        assert record is not None and (record.head_seq, record.last_consolidated) == (4, 0)
        assert _contents(await b.read_messages("s")) == [f"new-{i}" for i in range(4)]
        assert await b.read_archive("s") == []
