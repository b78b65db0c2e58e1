"""``statekeel ui``: bad input fails with one line and a non-zero exit before anything listens; a real
server process answers over HTTP, with its token when it has one, and leaves the database as it was."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import SECRET_TEXT, Prepared, fill_kinds_store, fill_sealed_session, ui_process, write_key_file
from statekeel.cli import main

TOKEN = "a-token-of-enough-length"


def run_ui(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["ui", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize("name", ["missing.db", "sub/dir/missing.db"])
def test_a_store_that_does_not_exist_is_one_line_and_exit_1_and_no_file_is_made(
    tmp_path: Path, name: str
) -> None:
    db = tmp_path / name
    code, output = run_ui("--db", f"sqlite:///{db}", "--port", "0")
    assert code == 1
    assert output.count("\n") == 1 and f"no store at {db}" in output
    assert not db.exists()


def test_a_file_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "notes.db"
    db.write_text("just some notes\n")
    code, output = run_ui("--db", f"sqlite:///{db}", "--port", "0")
    assert code == 1 and output.count("\n") == 1 and "StorageCorrupt" in output
    assert db.read_text() == "just some notes\n"


def test_an_unknown_url_scheme_is_refused(tmp_path: Path) -> None:
    code, output = run_ui("--db", "mongodb://localhost/x", "--port", "0")
    assert code == 1 and output.count("\n") == 1 and "unknown store URL scheme" in output


def test_listening_beyond_loopback_without_a_token_is_refused(prepared: Prepared) -> None:
    code, output = run_ui("--db", prepared.url, "--host", "0.0.0.0", "--port", "0")
    assert code == 1 and output.count("\n") == 1 and "pass --token" in output


def test_a_port_already_taken_is_one_line_and_exit_1(prepared: Prepared) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, output = run_ui("--db", prepared.url, "--port", str(port))
    assert code == 1 and output.count("\n") == 1 and "OSError" in output


def status_of(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=20) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_server_answers_and_stops_cleanly_leaving_the_database_unchanged(prepared: Prepared) -> None:
    before = hashlib.sha256(prepared.path.read_bytes()).hexdigest()
    with ui_process("--db", prepared.url) as base:
        assert base.startswith("http://127.0.0.1:")
        assert status_of(base) == 200
        assert status_of(base + "session?key=chat-openai") == 200
        assert status_of(base + "session?key=nobody") == 404
    assert hashlib.sha256(prepared.path.read_bytes()).hexdigest() == before


def test_a_server_with_a_token_refuses_requests_without_it(prepared: Prepared) -> None:
    with ui_process("--db", prepared.url, "--host", "0.0.0.0", "--token", TOKEN) as base:
        local = base.replace("0.0.0.0", "127.0.0.1")
        assert status_of(local) == 401
        assert status_of(local + "?token=" + TOKEN) == 200
        assert status_of(local + "tasks", {"Authorization": f"Bearer {TOKEN}"}) == 200


def page(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_an_encrypted_store_shows_its_transcripts_with_the_key_file_and_says_a_key_is_needed_without(
    tmp_path: Path,
) -> None:
    key, db = bytes(range(32)), tmp_path / "sealed.db"
    asyncio.run(fill_sealed_session(f"sqlite:///{db}", key))
    key_file = write_key_file(tmp_path / "store.key", key, mode=0o644)
    code, output = run_ui("--db", f"sqlite:///{db}", "--key-file", str(key_file))
    assert code == 1 and "chmod 600" in output and len(output.strip().splitlines()) == 1
    key_file.chmod(0o600)
    with ui_process("--db", f"sqlite:///{db}", "--key-file", str(key_file)) as base:
        status, body = page(base + "session?key=chat")
        assert status == 200 and SECRET_TEXT in body
    with ui_process("--db", f"sqlite:///{db}") as base:
        assert page(base + "sessions")[0] == 200  # the listing needs no key
        status, body = page(base + "session?key=chat")
        assert status == 500 and "a key is needed" in body and "--key-file" in body
        assert SECRET_TEXT not in body


def test_a_root_that_is_not_a_directory_is_refused_before_serving(prepared: Prepared, tmp_path: Path) -> None:
    code, output = run_ui("--db", prepared.url, "--port", "0", "--root", str(tmp_path / "nowhere"))
    assert code == 2 and "does not exist" in output
    (tmp_path / "a-file").write_text("x")
    code, output = run_ui("--db", prepared.url, "--port", "0", "--root", str(tmp_path / "a-file"))
    assert code == 2 and "is a file" in output


def test_with_a_root_the_files_page_and_the_recovery_report_show_drift(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    kinds = asyncio.run(fill_kinds_store(f"sqlite:///{tmp_path / 'kinds.db'}", root))
    with ui_process("--db", kinds.url, "--root", str(root)) as base:
        status, files = page(base + "files")
        assert status == 200 and "badge drift-changed" in files and "badge drift-missing" in files
        status, report = page(base + "recovery")
        assert status == 200 and "2 recorded file(s) changed on disk" in report
    with ui_process("--db", kinds.url) as base:
        status, report = page(base + "recovery")
        assert status == 200 and "changed on disk" not in report and "not checked" in report
