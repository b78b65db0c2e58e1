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


@pytest.mark.parametrize("url", ["mysql://localhost/db", "sqlite3:///x.db", "file:///x.db", "x.db", ""])
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
