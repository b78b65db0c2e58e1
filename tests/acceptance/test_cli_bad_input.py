"""Bad input to ``statekeel``: one line naming the problem, a non-zero exit, never a traceback, and
nothing changed — unknown options, URLs that do not parse or point at nothing, files that are not stores.
Also where ``--db`` comes from: the command's own, the group's, ``$STATEKEEL_URL``, the default."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

import statekeel
from helpers import one_line_error, other_application_db, run_statekeel

READ_COMMANDS = [
    ["status"],
    ["doctor"],
    ["info"],
    ["sessions"],
    ["show", "chat"],
    ["tasks"],
    ["trace", "t-1"],
    ["audit", "verify"],
    ["migrate", "--check"],
]
EVERY_STORE_COMMAND = [*READ_COMMANDS, ["recover"], ["gc"], ["migrate"], ["backup", "out.db"]]


def make_store(path: Path, key: str) -> str:
    async def fill() -> None:
        async with statekeel.open_store(f"sqlite:///{path}") as store, store.sessions.open(key) as session:
            session.add_message("user", f"hello from {key}")

    asyncio.run(fill())
    return f"sqlite:///{path}"


def test_an_unknown_option_is_one_line_naming_it(tmp_path: Path) -> None:
    result = run_statekeel("info", "--bogus", cwd=tmp_path)
    assert result.returncode == 2
    assert "No such option '--bogus'" in one_line_error(result)
    assert "No such command 'nope'" in one_line_error(run_statekeel("nope", cwd=tmp_path))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("sqlite://host/x.db", "has a host part"),
        ("postgresql://me@db:99999/x", "does not parse"),
        ("postgresql:///agents", "needs a host"),
        ("mongodb://h/db", "is not a store URL"),
        ("agent.db", "is not a store URL"),
        ("memory://", "new, empty store"),
    ],
)
def test_a_db_url_that_does_not_parse_is_named(url: str, problem: str, tmp_path: Path) -> None:
    for command in (["status"], ["doctor"], ["recover"], ["backup", "out.db"]):
        assert problem in one_line_error(run_statekeel(*command, "--db", url, cwd=tmp_path)), command
    assert list(tmp_path.iterdir()) == []


def test_a_db_url_that_points_at_nothing_creates_nothing(tmp_path: Path) -> None:
    for command in EVERY_STORE_COMMAND:
        error = one_line_error(run_statekeel(*command, "--db", "sqlite:///missing.db", cwd=tmp_path))
        assert "no store at missing.db" in error, command
    assert list(tmp_path.iterdir()) == []
    unreachable = run_statekeel("status", "--db", "postgresql://me:s3cret@127.0.0.1:1/none", cwd=tmp_path)
    error = one_line_error(unreachable)
    assert "BackendUnavailable" in error and "s3cret" not in error


def test_a_file_that_is_not_a_store_is_left_byte_for_byte(tmp_path: Path) -> None:
    notes = tmp_path / "notes.db"
    notes.write_bytes(b"these are my notes\n" * 300)
    before = notes.read_bytes()
    for command in EVERY_STORE_COMMAND:
        error = one_line_error(run_statekeel(*command, "--db", f"sqlite:///{notes}", cwd=tmp_path))
        assert "not a SQLite database" in error, command
    assert notes.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_an_empty_file_stays_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    for command in EVERY_STORE_COMMAND:
        result = run_statekeel(*command, "--db", f"sqlite:///{empty}", cwd=tmp_path)
        if command == ["migrate", "--check"]:
            assert result.returncode == 1 and "schema version 0" in result.stdout
        elif command == ["migrate"]:
            assert "the file is empty (nothing was created); pass --create" in one_line_error(result)
        else:
            assert "is an empty file, not a statekeel store" in one_line_error(result), command
    assert empty.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]


def test_the_database_of_another_application_is_left_alone(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    other_application_db(other)
    before = hashlib.sha256(other.read_bytes()).hexdigest()
    for command in (["status"], ["recover"], ["gc"], ["migrate"]):
        error = one_line_error(run_statekeel(*command, "--db", f"sqlite:///{other}", cwd=tmp_path))
        assert "a SQLite database of another application" in error, command
    assert hashlib.sha256(other.read_bytes()).hexdigest() == before


def test_db_is_taken_from_the_command_then_the_group_then_the_environment(tmp_path: Path) -> None:
    own = make_store(tmp_path / "own.db", "own")
    group = make_store(tmp_path / "group.db", "group")
    env = make_store(tmp_path / "env.db", "env")
    environment = {"STATEKEEL_URL": env}

    def keys(*args: str) -> str:
        result = run_statekeel(*args, cwd=tmp_path, env=environment)
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert "own" in keys("--db", group, "sessions", "--db", own)
    assert "group" in keys("--db", group, "sessions")
    assert "env" in keys("sessions")
    assert "hello from own" in keys("show", "own", "--db", own)
    # Without any, ./statekeel.db: reported missing, not created.
    error = one_line_error(run_statekeel("info", cwd=tmp_path))
    assert "no store at statekeel.db" in error
    assert not (tmp_path / "statekeel.db").exists()


def test_a_sqlalchemy_postgresql_url_is_accepted(pg_migrated: str, tmp_path: Path) -> None:
    url = pg_migrated.replace("postgresql://", "postgresql+asyncpg://")
    result = run_statekeel("status", "--db", url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "sessions: 0" in result.stdout


def test_no_command_shows_the_help(tmp_path: Path) -> None:
    result = run_statekeel(cwd=tmp_path)
    assert result.returncode == 2
    text = result.stdout + result.stderr
    assert "Usage: statekeel [OPTIONS] COMMAND" in text and "doctor" in text and "Error" not in text


def _twice(url: str, host: str) -> str:
    """``url`` with its one ``host`` (``h:port``) named twice, as a several-host URL names its servers."""
    assert url.count(host) == 1, url
    return url.replace(host, f"{host},{host}")


def test_a_url_naming_several_hosts_reaches_them_from_every_command(
    pg_migrated: str, nats_url: str, tmp_path: Path
) -> None:
    async def migrate_nats() -> None:
        async with statekeel.open_store(nats_url):
            pass

    asyncio.run(migrate_nats())
    pg_twice = _twice(pg_migrated, "127.0.0.1:5432") + "?target_session_attrs=read-write"
    for url in (pg_twice, _twice(nats_url, "127.0.0.1:4222")):
        for command in (["status"], ["sessions"], ["doctor"]):
            result = run_statekeel(*command, "--db", url, cwd=tmp_path)
            assert result.returncode == 0, (command, url, result.stderr)
        assert "sessions: 0" in run_statekeel("status", "--db", url, cwd=tmp_path).stdout


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@127.0.0.1:1,127.0.0.1:2/db?target_session_attrs=read-write&failover_timeout=1",
        "nats://127.0.0.1:1,127.0.0.1:2?timeout=1",
    ],
)
def test_unreachable_hosts_of_a_several_host_url_are_named_not_misparsed(url: str, tmp_path: Path) -> None:
    for command in (["status"], ["sessions"]):
        error = one_line_error(run_statekeel(*command, "--db", url, cwd=tmp_path))
        assert "BackendUnavailable" in error and "127.0.0.1:1, 127.0.0.1:2" in error, error
        assert "does not parse" not in error
