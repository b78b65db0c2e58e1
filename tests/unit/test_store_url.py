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


# Every form of store URL the documentation shows (docs/*.md, README.md).
DOCUMENTED_URLS = [
    "sqlite:///statekeel.db",
    "sqlite:///agent-state.db",
    "sqlite:////var/lib/agent/state.db",
    "postgresql://user@host:5432/db",
    "postgresql://agent@db.internal/agents",
    "postgresql://agent@db1:5432,db2:5432/agents?target_session_attrs=read-write",
    "postgresql://user@host:5432/db?pgbouncer=true",
    "postgres://agent@db/agents",
    "mariadb://agent:secret@db-host:3306/agents",
    "mysql://user@host:3306/db",
    "nats://127.0.0.1:4222",
    "nats://user:pass@host:4222",
    "nats://h1:4222,h2:4222",
    "nats://127.0.0.1:4222?rest=sqlite:////var/lib/agent/state.db",
    "nats://host:4222?kinds=audit,traces&rest=sqlite:///state.db",
    "nats://n1:4222,n2:4222,n3:4222?replicas=3&rest=postgresql://app@db:5432/state?target_session_attrs=read-write",
]


@pytest.mark.parametrize("url", DOCUMENTED_URLS)
def test_the_command_line_accepts_every_documented_url_the_library_parses(url: str) -> None:
    from statekeel.backends.mysql.target import MyTarget
    from statekeel.backends.nats.url import parse_nats_url
    from statekeel.backends.postgres.target import PgTarget
    from statekeel.reading import check_url

    check_url(url)  # raises InvalidArgument for a URL the commands refuse
    scheme = url.partition("://")[0]
    parse = {"postgresql": PgTarget, "postgres": PgTarget, "mariadb": MyTarget, "mysql": MyTarget}
    if scheme in parse:
        parse[scheme](url)
    elif scheme == "nats":
        assert parse_nats_url(url).servers


def test_the_command_line_refuses_a_bad_port_in_any_host_of_a_several_host_url() -> None:
    from statekeel.reading import check_url

    for url in ("postgresql://u@h1:5432,h2:99999/db", "postgresql://u@h1:x,h2:5432/db"):
        with pytest.raises(statekeel.InvalidArgument, match="does not parse: the port in"):
            check_url(url)
    with pytest.raises(statekeel.InvalidArgument, match="memory://"):
        check_url("memory://")
    with pytest.raises(statekeel.InvalidArgument, match=r"rest=: SQLite URL .* has a host part"):
        check_url("nats://h1:4222,h2:4222?rest=sqlite://host/x.db")
