"""A store URL whose parts statekeel does not use is refused, not silently reinterpreted.

``sqlite:///agent.db?durability=full`` used to open ``agent.db`` at the default durability, and
``sqlite:///run#2.db`` opened (and created) a file named ``run``: data written where the caller did
not ask, under settings the caller did not ask for.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import statekeel


@pytest.mark.parametrize("suffix", ["a.db?durability=full", "run#2.db", "a.db?", "a.db#"])
async def test_sqlite_url_with_a_query_or_fragment_is_refused_and_creates_no_file(
    tmp_path: Path, suffix: str
) -> None:
    url = f"sqlite:///{os.fspath(tmp_path)}/{suffix}"
    with pytest.raises(statekeel.InvalidArgument, match="open_store"):
        await statekeel.open_store(url)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("url", ["memory://somewhere", "memory://?cache=shared", "memory:///x.db"])
async def test_memory_url_with_anything_after_the_scheme_is_refused(url: str) -> None:
    with pytest.raises(statekeel.InvalidArgument, match="memory://"):
        await statekeel.open_store(url)


async def test_plain_sqlite_and_memory_urls_still_open(tmp_path: Path) -> None:
    async with statekeel.open_store(f"sqlite:///{os.fspath(tmp_path)}/ok.db") as store:
        assert await store.backend.schema_version() > 0
    async with statekeel.open_store("memory://") as store:
        assert await store.backend.schema_version() > 0


@pytest.mark.parametrize("query", ["pool_max_size=²", "pool_min_size=¹", "pool_max_size=٣"])
async def test_postgres_pool_size_that_is_not_ascii_digits_raises_invalid_argument(query: str) -> None:
    # str.isdigit() accepts superscripts (int() then fails) and other scripts' digits.
    with pytest.raises(statekeel.InvalidArgument, match="pool_"):
        await statekeel.open_store(f"postgresql://u@127.0.0.1:1/db?{query}")


async def test_postgres_url_with_several_hosts_fails_to_connect_with_backend_unavailable() -> None:
    # Its default fallback directory used to raise a bare ValueError (the port "5432,h2:5433") before
    # asyncpg ever tried the hosts in turn.
    url = "postgresql://u@127.0.0.1:1,127.0.0.1:2/db?connect_timeout=2"
    with pytest.raises(statekeel.BackendUnavailable):
        await statekeel.open_store(url)
