"""The ``statekeel`` command group: --db resolution and ``info`` (the demo has its acceptance tests)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

import statekeel
from statekeel.cli import main, redact_url
from statekeel.cli.common import visible


def make_store(path: Path, statuses: dict[str, str]) -> None:
    async def fill() -> None:
        async with statekeel.open_store(f"sqlite:///{path}") as store:
            for key, status in statuses.items():
                await store.backend.create_session(key)
                if status != "active":
                    await store.backend.update_session(key, status=status)

    asyncio.run(fill())


def flat(text: str) -> str:
    return " ".join(text.split())


def test_info_reports_schema_sessions_and_integrity(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    make_store(db, {"a": "active", "b": "active", "c": "expired"})
    result = CliRunner().invoke(main, ["--db", f"sqlite:///{db}", "info"])
    assert result.exit_code == 0, result.output
    out = flat(result.output)
    version = len(os.listdir(Path(statekeel.__file__).parent / "backends" / "sqlite" / "migrations")) - 1
    assert f"schema version {version}" in out
    assert "sessions: 3 (2 active, 1 expired)" in out
    assert "integrity check: ok" in out


def test_info_reports_every_state_kind_and_the_database_files(tmp_path: Path) -> None:
    db = tmp_path / "kinds.db"

    async def fill() -> None:
        async with statekeel.open_store(f"sqlite:///{db}") as store:
            task = await store.tasks.create("build")
            await store.tasks.transition(task.id, "queued")
            await store.approvals.request("task:1", "shell", {"cmd": "ls"}, "agent")

    asyncio.run(fill())
    result = CliRunner().invoke(main, ["--db", f"sqlite:///{db}", "info"])
    assert result.exit_code == 0, result.output
    out = flat(result.output)
    assert "sessions: 0 tasks: 1 (1 queued) workflows: 0" in out
    assert "approvals pending: 1 audit entries: 3" in out  # the task's creation and transition, the request
    assert "memories: 0, open contradictions: 0, file changes: 0" in out
    assert "database file: " in out and "WAL: " in out


def test_db_defaults_to_statekeel_url_from_the_environment(tmp_path: Path) -> None:
    db = tmp_path / "env.db"
    make_store(db, {"x": "active"})
    result = CliRunner().invoke(main, ["info"], env={"STATEKEEL_URL": f"sqlite:///{db}"})
    assert result.exit_code == 0, result.output
    assert "sessions: 1 (1 active)" in flat(result.output)


def test_db_defaults_to_statekeel_db_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STATEKEEL_URL", raising=False)
    result = CliRunner().invoke(main, ["info"])
    assert result.exit_code == 1
    assert "no store at statekeel.db" in flat(result.output)
    assert os.listdir(tmp_path) == []  # info never creates a store
    make_store(tmp_path / "statekeel.db", {"here": "active"})
    result = CliRunner().invoke(main, ["info"])
    assert result.exit_code == 0, result.output
    assert "sessions: 1" in flat(result.output)


def test_info_on_a_file_that_is_not_a_store_exits_1_and_leaves_it(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello\n" * 100)
    result = CliRunner().invoke(main, ["--db", f"sqlite:///{path}", "info"])
    assert result.exit_code == 1
    assert "StorageCorrupt" in flat(result.output)
    assert path.read_text() == "hello\n" * 100


def test_info_with_an_unknown_scheme_exits_1(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--db", "mongodb://h/db", "info"])
    assert result.exit_code == 1
    assert "'mongodb://h/db' is not a store URL" in flat(result.output)


def test_group_level_db_on_the_command_line_is_used_by_the_demo(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    result = CliRunner().invoke(main, ["--db", f"sqlite:///{db}", "demo", "--stress", "--sessions", "1"])
    assert result.exit_code == 0, result.output
    assert db.exists()
    assert f"store: sqlite:///{db}" in flat(result.output)


def test_demo_ignores_statekeel_url_and_uses_a_temporary_directory(tmp_path: Path) -> None:
    db = tmp_path / "mine.db"
    result = CliRunner().invoke(
        main, ["demo", "--stress", "--sessions", "1"], env={"STATEKEEL_URL": f"sqlite:///{db}"}
    )
    assert result.exit_code == 0, result.output
    assert not db.exists()
    assert "(temporary, removed afterwards)" in flat(result.output)


def test_info_never_prints_a_database_password() -> None:
    result = CliRunner().invoke(main, ["--db", "postgresql://ada:s3cret@127.0.0.1:1/none", "info"])
    assert result.exit_code == 1
    assert "s3cret" not in result.output
    assert "ada:***@127.0.0.1:1" in flat(result.output)


QUERY_PASSWORD_URL = "postgresql://ada@127.0.0.1:1/none?password=s3cret&connect_timeout=2"


def test_info_never_prints_a_password_from_the_query_string() -> None:
    result = CliRunner().invoke(main, ["--db", QUERY_PASSWORD_URL, "info"])
    assert result.exit_code == 1
    assert "s3cret" not in result.output
    assert "127.0.0.1:1" in result.output


def test_redact_url_blanks_a_query_string_password_and_keeps_other_options() -> None:
    shown = redact_url(QUERY_PASSWORD_URL)
    assert "s3cret" not in shown
    assert "connect_timeout=2" in shown
    assert shown.startswith("postgresql://ada@127.0.0.1:1/none?")


def test_control_characters_are_shown_as_cat_v_shows_them() -> None:
    controls = bytes(c for c in range(0xA0) if c not in (0x09, 0x0A) and not 0x20 <= c < 0x7F)
    cat = subprocess.run(["cat", "-v"], input=controls, capture_output=True, check=True).stdout
    assert visible(controls.decode("latin-1")) == cat.decode("ascii")
    plain = "tab\tand newline\n, é, 令, emoji 🙂 stay"
    assert visible(plain) is plain


@pytest.mark.parametrize(("count", "said"), [(0, "0 sessions"), (1, "1 session"), (2, "2 sessions")])
def test_sessions_counts_them_in_words(tmp_path: Path, count: int, said: str) -> None:
    db = tmp_path / "n.db"
    make_store(db, {f"s{i}": "active" for i in range(count)})
    for args in (["sessions"], ["sessions", "--tree"]):
        result = CliRunner().invoke(main, ["--db", f"sqlite:///{db}", *args])
        assert result.exit_code == 0, result.output
        if count:
            assert result.output.splitlines()[-1] == said
        assert "(s)" not in result.output


def test_a_dry_run_of_gc_on_an_empty_store_would_delete_0_rows(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    make_store(db, {})
    result = CliRunner().invoke(main, ["--db", f"sqlite:///{db}", "gc", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "would delete 0 rows in " in flat(result.output)
    assert "(s)" not in result.output and " 1 rows" not in result.output


@pytest.mark.parametrize(
    ("sessions", "said"), [({}, "would delete 0 records "), ({"user:al": "active"}, "would delete 1 record ")]
)
def test_a_dry_run_of_erase_counts_the_records_in_words(
    tmp_path: Path, sessions: dict[str, str], said: str
) -> None:
    db = tmp_path / "erase.db"
    make_store(db, sessions)
    args = [
        "--db",
        f"sqlite:///{db}",
        "erase",
        "user:al",
        "--dry-run",
        "--actor",
        "dpo",
        "--reason",
        "request 1",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert said in flat(result.output)
