"""Invariant 9: bad input raises a typed error before anything is written, and the store stays usable.

Each test checks the error type, that nothing was written, and that the same store (or a fresh open of the
same path) still works afterwards.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import statekeel
from helpers import exists, other_application_db
from statekeel.backends.base import NewMessage


async def assert_usable(store: statekeel.Store, key: str = "still-usable") -> None:
    session = await store.sessions.get_or_create(key)
    session.add_message("user", "hello")
    await store.sessions.save(session)
    rows = await store.backend.read_messages(key)
    assert [r.payload["content"] for r in rows] == ["hello"]


async def assert_nothing_written(store: statekeel.Store) -> None:
    # Through the backend: the session manager's cache would show unsaved sessions.
    assert (await store.backend.list_sessions()).items == []
    fallback = store.options.fallback_dir
    assert fallback is None or not exists(fallback) or os.listdir(fallback) == []


BAD_KEYS: list[Any] = ["", "a\x00b", "k" * 513, "é" * 257, 42, None, b"bytes", ["k"]]
BAD_KEY_IDS = ["empty", "nul", "513-bytes", "257-two-byte-chars", "int", "none", "bytes", "list"]


@pytest.mark.parametrize("key", BAD_KEYS, ids=BAD_KEY_IDS)
async def test_bad_session_key_is_invalid_key_and_nothing_is_written(
    store: statekeel.Store, key: Any
) -> None:
    with pytest.raises(statekeel.InvalidKey):
        await store.sessions.get_or_create(key)
    with pytest.raises(statekeel.InvalidKey):
        await store.sessions.load(key)
    await assert_nothing_written(store)
    await assert_usable(store)


async def test_key_of_exactly_512_bytes_is_accepted(store: statekeel.Store) -> None:
    await assert_usable(store, "k" * 512)


@pytest.mark.parametrize(
    "content",
    [{1, 2}, float("nan"), float("inf"), {"f": lambda: 1}, {1: "int key"}, object()],
    ids=["set", "nan", "inf", "function", "int-key", "object"],
)
async def test_unstorable_message_is_refused_by_add_message(store: statekeel.Store, content: Any) -> None:
    session = await store.sessions.get_or_create("s")
    with pytest.raises(statekeel.SerializationError) as info:
        session.add_message("user", content)
    assert info.value.path.startswith("messages[0].content")
    assert session.messages == []
    await store.sessions.save(session)  # nothing to write but the (empty) session itself
    assert await store.backend.read_messages("s") == []
    await assert_usable(store)


async def test_message_made_unstorable_after_add_fails_save_and_writes_nothing(
    store: statekeel.Store,
) -> None:
    session = await store.sessions.get_or_create("s")
    session.add_message("user", "fine")
    session.add_message("user", "later broken")
    session.messages[1]["content"] = {"nested": {float("nan")}}
    with pytest.raises(statekeel.SerializationError) as info:
        await store.sessions.save(session)
    assert info.value.path == "messages[1].content.nested"
    await assert_nothing_written(store)
    session.messages[1]["content"] = "repaired"
    await store.sessions.save(session)
    rows = await store.backend.read_messages("s")
    assert [r.payload["content"] for r in rows] == ["fine", "repaired"]


async def test_unstorable_metadata_fails_save_and_writes_nothing(store: statekeel.Store) -> None:
    session = await store.sessions.get_or_create("s")
    session.add_message("user", "hi")
    session.metadata["when"] = {1, 2}
    with pytest.raises(statekeel.SerializationError) as info:
        await store.sessions.save(session)
    assert info.value.path.startswith("metadata")
    await assert_nothing_written(store)
    await assert_usable(store)


async def test_payload_over_the_limit_is_payload_too_large_and_nothing_is_written(
    store_url: str, tmp_path: Path
) -> None:
    async with statekeel.open_store(store_url, max_record_bytes=2048) as store:
        session = await store.sessions.get_or_create("s")
        with pytest.raises(statekeel.PayloadTooLarge):
            session.add_message("tool", "x" * 4096)
        assert session.messages == []
        session.add_message("user", "small")
        session.messages[0]["content"] = "y" * 4096
        with pytest.raises(statekeel.PayloadTooLarge):
            await store.sessions.save(session)
        await assert_nothing_written(store)
        await assert_usable(store)


@pytest.mark.parametrize("expected_head", [-1, -100, "0", 0.0, 1.5, True, None], ids=repr)
async def test_bad_expected_head_is_invalid_argument_before_any_write(
    store: statekeel.Store, expected_head: Any
) -> None:
    b = store.backend
    msg = NewMessage("user", store.codec.encode({"role": "user", "content": "x"}))
    with pytest.raises(statekeel.InvalidArgument):
        await b.append_messages("new", expected_head, [msg], create=True)
    assert await b.load_session("new") is None
    await b.append_messages("old", 0, [msg], create=True)
    with pytest.raises(statekeel.InvalidArgument):
        await b.append_messages("old", expected_head, [msg])
    assert [r.seq for r in await b.read_messages("old")] == [0]
    await assert_usable(store)


@pytest.mark.parametrize("url", ["mongodb://localhost/db", "sqlite3:///x.db", "file:///x.db", "x.db", ""])
async def test_unknown_url_scheme_is_invalid_argument(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(statekeel.InvalidArgument) as info:
        await statekeel.open_store(url)
    assert "sqlite:///" in str(info.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("url", [42, b"sqlite:///x.db", 3.5], ids=repr)
async def test_non_str_url_is_invalid_argument(url: Any) -> None:
    with pytest.raises(statekeel.InvalidArgument):
        await statekeel.open_store(url)


@pytest.mark.parametrize("suffix", ["a.db?durability=full", "run#2.db", "a.db?", "a.db#"])
async def test_sqlite_url_with_a_query_or_fragment_is_refused_and_creates_no_file(
    tmp_path: Path, suffix: str
) -> None:
    # Not reinterpreted: "?durability=full" is not an option here, and "#2.db" is not cut off the name.
    url = f"sqlite:///{os.fspath(tmp_path)}/{suffix}"
    with pytest.raises(statekeel.InvalidArgument, match="open_store"):
        await statekeel.open_store(url)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("url", ["memory://somewhere", "memory://?cache=shared", "memory:///x.db"])
async def test_memory_url_with_anything_after_the_scheme_is_refused(url: str) -> None:
    with pytest.raises(statekeel.InvalidArgument, match="memory://"):
        await statekeel.open_store(url)


async def test_plain_sqlite_and_memory_urls_open(tmp_path: Path) -> None:
    async with statekeel.open_store(f"sqlite:///{os.fspath(tmp_path)}/ok.db") as store:
        assert await store.backend.schema_version() > 0
    async with statekeel.open_store("memory://") as store:
        assert await store.backend.schema_version() > 0


async def test_sqlite_path_that_is_a_directory_is_invalid_argument(tmp_path: Path) -> None:
    target = tmp_path / "a-directory"
    target.mkdir()
    with pytest.raises(statekeel.InvalidArgument) as info:
        await statekeel.open_store(f"sqlite:///{target}")
    assert str(target) in str(info.value)
    assert os.listdir(target) == []
    async with statekeel.open_store(f"sqlite:///{target}/inside.db") as store:
        await assert_usable(store)


@pytest.mark.parametrize(
    "content",
    [b"just some text, not a database\n" * 10, b"\x00" * 4096, b"SQLite format 3\x00" + b"\xff" * 2000],
    ids=["text", "zeros", "bad-pages"],
)
async def test_file_that_is_not_a_sqlite_database_is_storage_corrupt_and_untouched(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    with pytest.raises(statekeel.StorageCorrupt) as info:
        await statekeel.open_store(f"sqlite:///{path}")
    assert str(path) in str(info.value)
    assert info.value.path == str(path)
    assert path.read_bytes() == content
    assert sorted(os.listdir(tmp_path)) == ["notes.db"]
    async with statekeel.open_store(f"sqlite:///{tmp_path}/good.db") as store:
        await assert_usable(store)


async def test_sqlite_database_of_another_application_is_storage_corrupt_and_untouched(
    tmp_path: Path,
) -> None:
    path = tmp_path / "other.db"
    before = other_application_db(path)
    with pytest.raises(statekeel.StorageCorrupt) as info:
        await statekeel.open_store(f"sqlite:///{path}")
    assert "invoices" in str(info.value)
    assert path.read_bytes() == before  # not even switched to WAL
    assert sorted(os.listdir(tmp_path)) == ["other.db"]


async def test_missing_parent_directory_is_backend_unavailable_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(statekeel.BackendUnavailable):
        await statekeel.open_store(f"sqlite:///{tmp_path}/no/such/dir/x.db")
    assert os.listdir(tmp_path) == []
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory should be")
    with pytest.raises(statekeel.BackendUnavailable):
        await statekeel.open_store(f"sqlite:///{blocker}/x.db")
    assert sorted(os.listdir(tmp_path)) == ["file"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses sysfs, which refuses new files")
async def test_unwritable_directory_is_backend_unavailable(tmp_path: Path) -> None:
    # Tests run as root, for whom chmod does not make a directory unwritable; sysfs refuses new files to
    # everyone.
    target = "/sys/statekeel-test.db"
    with pytest.raises(statekeel.BackendUnavailable) as info:
        await statekeel.open_store(f"sqlite:///{target}")
    assert target in str(info.value)
    assert not exists(target)
    async with statekeel.open_store(f"sqlite:///{tmp_path}/ok.db") as store:
        await assert_usable(store)


@pytest.mark.parametrize(
    "options",
    [
        {"durability": "sometimes"},
        {"busy_timeout_ms": -1},
        {"busy_timeout_ms": "5000"},
        {"max_record_bytes": 0},
        {"cache_size": 0},
        {"encryption_key": b"k" * 16},
        {"encrypt_existing": True},
    ],
    ids=repr,
)
async def test_bad_open_options_are_invalid_argument_and_create_nothing(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    with pytest.raises(statekeel.InvalidArgument):
        await statekeel.open_store(f"sqlite:///{tmp_path}/x.db", **options)
    assert os.listdir(tmp_path) == []


class _NoOffset(dt.tzinfo):
    """A tzinfo that knows no offset: datetimes carrying it are naive although tzinfo is set."""

    def utcoffset(self, _: dt.datetime | None) -> None:
        return None

    def dst(self, _: dt.datetime | None) -> None:
        return None

    def tzname(self, _: dt.datetime | None) -> str:
        return "?"


async def test_a_datetime_whose_tzinfo_has_no_offset_is_refused_as_naive(store: statekeel.Store) -> None:
    naive = dt.datetime(2999, 1, 1, tzinfo=_NoOffset())
    with pytest.raises(statekeel.InvalidArgument):
        await store.approvals.request("task:1", "shell", {}, "agent", expires_at=naive)
    with pytest.raises(statekeel.InvalidArgument):
        await store.tasks.expire_leases(now=naive)
    with pytest.raises(statekeel.InvalidArgument):
        await store.audit.query(since=naive)
    assert await store.approvals.pending() == [] and (await store.audit.verify()).count == 0


BIG = 2**70
PAST_INT64 = 2**63
# Aware datetimes whose UTC equivalent falls outside datetime's years 1-9999.
NO_UTC = [
    dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5))),
    dt.datetime.max.replace(tzinfo=dt.timezone(dt.timedelta(hours=-5))),
]


async def _written(store: statekeel.Store) -> dict[str, int]:
    return {t.name: await store.backend.count_rows(t.name) for t in await store.backend.copy_tables()}


def _out_of_range_calls(store: statekeel.Store, task_id: str) -> dict[str, Any]:
    s = store
    return {
        "tasks.list limit": lambda: s.tasks.list(limit=PAST_INT64),
        "tasks.heartbeat lease_epoch": lambda: s.tasks.heartbeat(task_id, "w", BIG),
        "tasks.create priority": lambda: s.tasks.create("x", priority=BIG),
        "tasks.claim lease_seconds": lambda: s.tasks.claim("w", lease_seconds=1e308 * 10),
        "audit.query after_seq": lambda: s.audit.query(after_seq=PAST_INT64),
        "audit.query limit": lambda: s.audit.query(limit=PAST_INT64),
        "sessions.list limit": lambda: s.sessions.list(limit=PAST_INT64),
        "memory.query limit": lambda: s.memory.query(limit=PAST_INT64),
        "memory.episodes limit": lambda: s.memory.episodes(limit=PAST_INT64),
        "memory.add_episode seqs": lambda: s.memory.add_episode("s", "sum", first_seq=BIG, upto_seq=BIG + 1),
        "memory.accesses limit": lambda: s.memory.accesses("m", limit=PAST_INT64),
        "memory.put confidence": lambda: s.memory.put("user", "k", "c", confidence=1e308 * 10),
        "memory.relate weight": lambda: s.memory.relate("a", "r", "b", weight=1e308 * 10),
        "vectors.upsert source_version": lambda: s.vectors.upsert(
            "v", "src", [1.0, 0.5], model="m", source_version=BIG
        ),
        "vectors.upsert float32 overflow": lambda: s.vectors.upsert("v", "src", [1e39, 0.5], model="m"),
        "vectors.search k": lambda: s.vectors.search([1.0, 0.5], k=PAST_INT64),
        "vectors.lagging limit": lambda: s.vectors.lagging(limit=PAST_INT64),
        "vectors.source_changed version": lambda: s.vectors.source_changed("src", BIG),
        "traces.query limit": lambda: s.traces.query(limit=PAST_INT64),
        "files.record size": lambda: s.files.record("a.txt", "0" * 64, BIG),
    }


async def test_an_int_past_64_bits_or_an_overflowing_float_is_a_typed_error_and_writes_nothing(
    store: statekeel.Store,
) -> None:
    task = await store.tasks.create("t")
    before = await _written(store)
    for name, call in _out_of_range_calls(store, task.id).items():
        try:
            await call()
        except (statekeel.InvalidArgument, statekeel.InvalidEmbedding):
            pass
        else:
            pytest.fail(f"{name} accepted a value out of range")
        assert await _written(store) == before, name
    await assert_usable(store)


@pytest.mark.parametrize("when", NO_UTC, ids=["year-1-east", "year-9999-west"])
async def test_an_aware_datetime_without_a_utc_equivalent_is_invalid_argument_and_writes_nothing(
    store: statekeel.Store, when: dt.datetime
) -> None:
    before = await _written(store)
    calls = {
        "approvals.request expires_at": lambda: store.approvals.request(
            "task:1", "shell", {}, "agent", expires_at=when
        ),
        "memory.put expires_at": lambda: store.memory.put("user", "k", "c", expires_at=when),
        "memory.relate valid_from": lambda: store.memory.relate("a", "r", "b", valid_from=when),
        "memory.relations at": lambda: store.memory.relations("a", at=when),
        "tasks.expire_leases now": lambda: store.tasks.expire_leases(now=when),
        "sessions.cleanup_expired now": lambda: store.sessions.cleanup_expired(now=when),
        "audit.query since": lambda: store.audit.query(since=when),
        "traces.query since": lambda: store.traces.query(since=when),
        "purge now": lambda: store.purge(now=when),
    }
    for name, call in calls.items():
        with pytest.raises(statekeel.InvalidArgument):
            await call()
        assert await _written(store) == before, name
    await assert_usable(store)


@pytest.mark.parametrize(
    "when",
    [dt.datetime.min.replace(tzinfo=dt.UTC), dt.datetime.max.replace(tzinfo=dt.UTC)],
    ids=["min", "max"],
)
async def test_the_first_and_last_utc_datetimes_are_stored_and_read_back(
    store: statekeel.Store, when: dt.datetime
) -> None:
    """The edges of the range check_aware accepts are stored as they are on every backend (PostgreSQL's
    driver keeps them as -infinity / infinity and reads them back without a zone)."""
    put = await store.memory.put("user", "edge", "c", expires_at=when)
    got = await store.memory.get(put.id)
    assert got is not None and got.expires_at == when
    edge = await store.memory.relate("a", "r", "b", valid_from=when)
    assert edge.valid_from == when
