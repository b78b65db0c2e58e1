"""Which store ``open_store()`` opens: ``$STATEKEEL_URL`` without a URL, then ``sqlite:///statekeel.db``;
SQLAlchemy's ``postgresql+asyncpg://`` read as ``postgresql://``."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import pytest

import statekeel


def test_open_store_without_a_url_reads_statekeel_url_then_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STATEKEEL_URL", f"sqlite:///{tmp_path / 'env.db'}")

    async def open_default() -> str:
        async with statekeel.open_store() as store:
            return store.url

    assert asyncio.run(open_default()) == f"sqlite:///{tmp_path / 'env.db'}"
    monkeypatch.delenv("STATEKEEL_URL")
    assert asyncio.run(open_default()) == "sqlite:///statekeel.db"
    assert (tmp_path / "statekeel.db").exists()
    conn = sqlite3.connect(tmp_path / "statekeel.db")
    try:
        assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone()[0] > 0
    finally:
        conn.close()


def test_a_sqlalchemy_postgresql_url_is_read_as_postgresql() -> None:
    from statekeel.store import resolve_url

    assert resolve_url("postgresql+asyncpg://me@db:5432/agents") == "postgresql://me@db:5432/agents"
    assert resolve_url("postgres+asyncpg://me@db/agents") == "postgresql://me@db/agents"
    assert resolve_url("sqlite:///a.db") == "sqlite:///a.db"
    assert os.environ.get("STATEKEEL_URL") is None or resolve_url(None) == os.environ["STATEKEEL_URL"]


def test_sqlite_file_names_the_file_of_a_sqlite_url_only() -> None:
    from statekeel.store import sqlite_file

    assert sqlite_file("sqlite:///agent.db") == "agent.db"
    assert sqlite_file("sqlite:////var/lib/agent.db") == "/var/lib/agent.db"
    assert sqlite_file("memory://") is None
    assert sqlite_file("postgresql://agent@db.example/agent") is None
    with pytest.raises(statekeel.InvalidArgument, match="query string"):
        sqlite_file("sqlite:///agent.db?mode=ro")
