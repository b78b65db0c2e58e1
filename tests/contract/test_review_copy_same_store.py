"""copy_store refuses a destination that is the source itself, however the two are named.

``overwrite=True`` empties the destination before copying: when the destination is the source under
another URL (``./a.db`` and ``a.db``, a port spelled out, a second open ``Store``), that deletes the data
it was asked to copy and then "verifies" an empty copy of an empty store.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import statekeel


def _sqlite(path: Path) -> str:
    return f"sqlite:///{os.fspath(path)}"


async def _fill(store: statekeel.Store) -> None:
    session = await store.sessions.get_or_create("s")
    session.add_message("user", "precious")
    await store.sessions.save(session)
    await store.tasks.create("a task")


async def _still_there(url: str) -> None:
    async with statekeel.open_store(url) as store:
        assert [r.payload["content"] for r in await store.backend.read_messages("s")] == ["precious"]
        assert await store.backend.count_rows("tasks") == 1


@pytest.mark.parametrize("flags", [{"overwrite": True}, {"resume": True}, {}])
async def test_copy_to_the_same_sqlite_file_under_another_url_is_refused(
    tmp_path: Path, flags: dict[str, bool]
) -> None:
    url = _sqlite(tmp_path / "a.db")
    async with statekeel.open_store(url) as store:
        await _fill(store)
    alias = f"sqlite:///{os.fspath(tmp_path)}/./a.db"
    assert alias != url
    with pytest.raises(statekeel.InvalidArgument, match="same"):
        await statekeel.copy_store(url, alias, **flags)
    await _still_there(url)


async def test_copy_between_two_open_stores_on_one_sqlite_file_is_refused(tmp_path: Path) -> None:
    url = _sqlite(tmp_path / "a.db")
    async with statekeel.open_store(url) as src, statekeel.open_store(url) as dst:
        await _fill(src)
        with pytest.raises(statekeel.InvalidArgument, match="same"):
            await statekeel.copy_store(src, dst, overwrite=True)
    await _still_there(url)


@pytest.mark.postgres
async def test_copy_to_the_same_postgres_database_under_another_url_is_refused(pg_migrated: str) -> None:
    async with statekeel.open_store(pg_migrated) as store:
        await _fill(store)
    alias = pg_migrated.replace("127.0.0.1", "localhost") + "?pool_max_size=3"
    assert alias != pg_migrated
    with pytest.raises(statekeel.InvalidArgument, match="same"):
        await statekeel.copy_store(pg_migrated, alias, overwrite=True)
    await _still_there(pg_migrated)


async def test_copy_between_two_distinct_stores_still_works(tmp_path: Path) -> None:
    src = _sqlite(tmp_path / "a.db")
    async with statekeel.open_store(src) as store:
        await _fill(store)
    report = await statekeel.copy_store(src, "sqlite:///" + os.fspath(tmp_path / "b.db"))
    assert report.verified and report.copied >= 3
    await _still_there(_sqlite(tmp_path / "b.db"))
