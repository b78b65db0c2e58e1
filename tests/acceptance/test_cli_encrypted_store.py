"""The ``statekeel`` commands on an encrypted store, as a user runs them: the keys come from an owner-only
key file (``--key-file``, ``$STATEKEEL_KEY_FILE``), never from the command line; without them a command
that would show a sealed value says a key is needed, and counts still work; ``rotate-key`` moves every
value to the key file's first key."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

import statekeel
from helpers import SECRET_TEXT, fill_sealed_session, one_line_error, run_statekeel, write_key_file

KEY = bytes(range(32))
OLD_KEY = bytes(range(100, 132))
SECRET = SECRET_TEXT


def flat(text: str) -> str:
    return " ".join(text.split())


def sqlite_store(tmp_path: Path, key: bytes | None = KEY) -> tuple[str, Path]:
    path = tmp_path / "agent.db"
    url = f"sqlite:///{path}"
    asyncio.run(fill_sealed_session(url, key))
    return url, path


def sealed_payloads(db: Path) -> list[str]:
    """The stored payload of every message, read behind statekeel's back."""
    conn = sqlite3.connect(db)
    try:
        return [p for (p,) in conn.execute("SELECT payload FROM messages ORDER BY seq")]
    finally:
        conn.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def encrypted_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        url: str = request.getfixturevalue("pg_migrated")
        asyncio.run(fill_sealed_session(url, KEY))
        return url
    return sqlite_store(tmp_path)[0]


def test_show_and_sessions_read_an_encrypted_store_with_the_key_file(
    encrypted_url: str, tmp_path: Path
) -> None:
    keys = write_key_file(tmp_path / "store.key", KEY)
    shown = run_statekeel("show", "chat", "--db", encrypted_url, "--key-file", str(keys), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert SECRET in shown.stdout and "→ tool call ls" in flat(shown.stdout)
    as_json = run_statekeel(
        "show", "chat", "--json", "--db", encrypted_url, "--key-file", str(keys), cwd=tmp_path
    )
    messages = json.loads(as_json.stdout)["messages"]
    assert messages[0]["message"]["content"] == f"tell me {SECRET}"
    listed = run_statekeel("sessions", "--json", "--db", encrypted_url, "--key-file", str(keys), cwd=tmp_path)
    assert [r["key"] for r in json.loads(listed.stdout)] == ["chat"]
    # The same key from the environment, and from the group's option.
    by_env = run_statekeel(
        "show", "chat", "--db", encrypted_url, cwd=tmp_path, env={"STATEKEEL_KEY_FILE": str(keys)}
    )
    assert by_env.returncode == 0 and SECRET in by_env.stdout, by_env.stderr
    by_group = run_statekeel("--key-file", str(keys), "show", "chat", "--db", encrypted_url, cwd=tmp_path)
    assert by_group.returncode == 0 and SECRET in by_group.stdout, by_group.stderr


def test_without_a_key_show_says_a_key_is_needed_and_counts_still_work(
    encrypted_url: str, tmp_path: Path
) -> None:
    error = one_line_error(run_statekeel("show", "chat", "--db", encrypted_url, cwd=tmp_path))
    assert "encrypted" in error and "--key-file PATH" in error and "STATEKEEL_KEY_FILE" in error
    assert SECRET not in error
    listed = run_statekeel("sessions", "--db", encrypted_url, cwd=tmp_path)
    assert listed.returncode == 0 and "1 session" in listed.stdout.splitlines(), listed.stderr
    status = run_statekeel("status", "--json", "--db", encrypted_url, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["counts"]["sessions"]["active"] == 1


def test_without_a_key_doctor_and_recover_say_the_session_needs_the_key_and_repair_nothing(
    tmp_path: Path,
) -> None:
    url, db = sqlite_store(tmp_path)
    doctor = run_statekeel("doctor", "--json", "--db", url, cwd=tmp_path)
    assert doctor.returncode == 1, doctor.stderr
    [finding] = [f for f in json.loads(doctor.stdout)["findings"] if f["severity"] == "problem"]
    assert "session chat could not be checked" in finding["detail"] and "--key-file" in finding["advice"]
    recovered = run_statekeel("recover", "--db", url, cwd=tmp_path)
    assert recovered.returncode == 1
    out = flat(recovered.stdout)
    assert "1 session that could not be checked" in out and "needs its keys (--key-file PATH)" in out
    # No repair was written into the transcript it could not read (it would have been in plaintext).
    payloads = sealed_payloads(db)
    assert len(payloads) == 2 and all(json.loads(p)["$sk"] == "enc" for p in payloads)


def test_a_wrong_key_names_the_key_id_the_store_needs(tmp_path: Path) -> None:
    url, _ = sqlite_store(tmp_path)
    wrong = write_key_file(tmp_path / "wrong.key", OLD_KEY)
    error = one_line_error(run_statekeel("show", "chat", "--db", url, "--key-file", str(wrong), cwd=tmp_path))
    assert "DecryptionError" in error and statekeel.key_id(KEY) in error and "--key-file" in error


@pytest.mark.parametrize(
    ("content", "mode", "message"),
    [
        (None, 0o600, "does not exist"),
        ("dir", 0o700, "not a regular file"),
        (KEY.hex(), 0o644, "readable by others than its owner (mode 0644): refused; run chmod 600"),
        (KEY.hex(), 0o640, "(mode 0640): refused; run chmod 600"),
        (
            KEY.hex()[:-2],
            0o600,
            "line 1: not a key (62 characters); each line holds one key of 64 hex digits",
        ),
        ("zz" * 32, 0o600, "line 1: not a key (64 characters)"),
        ("# nothing but a comment\n\n", 0o600, "holds no key"),
        (f"{KEY.hex()}\n{OLD_KEY.hex()}\n{KEY.hex()}", 0o600, "line 3: the same key as line 1"),
        ("ключ", 0o600, "is not text"),
    ],
    ids=[
        "missing",
        "directory",
        "world-readable",
        "group-readable",
        "short",
        "not-hex",
        "empty",
        "repeated",
        "not-ascii",
    ],
)
def test_a_bad_key_file_is_refused_in_one_line_and_the_store_is_unchanged(
    tmp_path: Path, content: str | None, mode: int, message: str
) -> None:
    url, db = sqlite_store(tmp_path)
    before = digest(db)
    path = tmp_path / "store.key"
    if content == "dir":
        path.mkdir(mode=mode)
    elif content is not None:
        path.write_text(content)
        path.chmod(mode)
    for args, env in (
        (["show", "chat", "--key-file", str(path)], {}),
        (["rotate-key", "--key-file", str(path)], {}),
        (["show", "chat"], {"STATEKEEL_KEY_FILE": str(path)}),
    ):
        error = one_line_error(run_statekeel(*args, "--db", url, cwd=tmp_path, env=env))
        assert message in error
        assert error.startswith("Error: $STATEKEEL_KEY_FILE: " if env else "Error: --key-file: "), error
        assert KEY.hex()[:16] not in error and "ключ" not in error  # never the file's contents
    assert digest(db) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["agent.db", *(["store.key"] if content else [])]
    )


def test_rotate_key_moves_every_value_to_the_new_key_so_the_old_one_is_no_longer_needed(
    tmp_path: Path,
) -> None:
    url, db = sqlite_store(tmp_path, OLD_KEY)
    error = one_line_error(run_statekeel("rotate-key", "--db", url, cwd=tmp_path))
    assert "needs the store's keys" in error and "--key-file PATH" in error
    both = write_key_file(tmp_path / "both.key", KEY, OLD_KEY)
    result = run_statekeel("rotate-key", "--db", url, "--key-file", str(both), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = flat(result.stdout)
    assert f"re-encrypted 2 of 2 rows under key id {statekeel.key_id(KEY)}" in out
    assert "the old keys can now be removed from the key file" in out
    again = run_statekeel("rotate-key", "--json", "--db", url, "--key-file", str(both), cwd=tmp_path)
    report = json.loads(again.stdout)
    assert report["key_id"] == statekeel.key_id(KEY) and report["total_rewritten"] == 0
    assert report["scanned"]["messages"] == 2

    new = write_key_file(tmp_path / "new.key", KEY)
    shown = run_statekeel("show", "chat", "--db", url, "--key-file", str(new), cwd=tmp_path)
    assert shown.returncode == 0 and SECRET in shown.stdout, shown.stderr
    old = write_key_file(tmp_path / "old.key", OLD_KEY)
    error = one_line_error(run_statekeel("show", "chat", "--db", url, "--key-file", str(old), cwd=tmp_path))
    assert statekeel.key_id(KEY) in error
    assert SECRET.encode() not in db.read_bytes()


def test_rotate_key_encrypt_existing_encrypts_a_store_written_without_a_key(tmp_path: Path) -> None:
    url, db = sqlite_store(tmp_path, None)
    keys = write_key_file(tmp_path / "store.key", KEY)
    error = one_line_error(run_statekeel("show", "chat", "--db", url, "--key-file", str(keys), cwd=tmp_path))
    assert "PlaintextRefused" in error and "rotate-key --encrypt-existing" in error
    result = run_statekeel(
        "rotate-key", "--encrypt-existing", "--db", url, "--key-file", str(keys), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "re-encrypted 2 of 2 rows" in flat(result.stdout)
    shown = run_statekeel("show", "chat", "--db", url, "--key-file", str(keys), cwd=tmp_path)
    assert shown.returncode == 0 and SECRET in shown.stdout, shown.stderr
    payloads = sealed_payloads(db)
    assert len(payloads) == 2 and all(json.loads(p)["$sk"] == "enc" for p in payloads)


def test_recover_with_the_key_file_answers_a_tool_call_with_a_sealed_result(tmp_path: Path) -> None:
    url, db = sqlite_store(tmp_path)
    keys = write_key_file(tmp_path / "store.key", KEY)
    result = run_statekeel("recover", "--db", url, "--key-file", str(keys), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "repaired 1 tool call answered with an 'interrupted' result" in flat(result.stdout)
    payloads = sealed_payloads(db)
    assert len(payloads) == 3 and all(json.loads(p)["$sk"] == "enc" for p in payloads)
    shown = run_statekeel("show", "chat", "--db", url, "--key-file", str(keys), cwd=tmp_path)
    assert "interrupted" in shown.stdout, shown.stderr
