"""Invariant 12: files statekeel creates are readable by their owner only, whatever the umask."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import statekeel


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(params=[0o022, 0o000], ids=["umask-022", "umask-000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


async def test_database_wal_and_shm_files_are_owner_only(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "agent.db"
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        session = await store.sessions.get_or_create("s")
        session.add_message("user", "hello")
        await store.sessions.save(session)
        assert await store.backend.read_messages("s")
        names = sorted(os.listdir(tmp_path))
        assert names == ["agent.db", "agent.db-shm", "agent.db-wal"]
        for name in names:
            assert mode(tmp_path / name) == 0o600, name
    assert mode(path) == 0o600
