"""``statekeel export``, ``import`` and ``erase`` as a user runs them: the file they write, what they
refuse, and the store they leave."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest

import statekeel
from helpers import one_line_error, run_statekeel

SUBJECT = "user:alice"


async def _fill(url: str) -> None:
    async with statekeel.open_store(url) as store:
        for key, meta in ((SUBJECT, {}), ("chat-1", {"subject": SUBJECT}), ("chat-2", {"subject": "bob"})):
            session = await store.sessions.get_or_create(key)
            session.metadata.update(meta)
            for i in range(3):
                session.add_message("user", f"{key} {i}")
            await store.sessions.save(session)
        await store.memory.put("user", "name", "Alice", scope=SUBJECT)
        await store.audit.append("note", "tester", "case", {"n": 1})


def _status(url: str, cwd: Path) -> dict[str, object]:
    result = run_statekeel("status", "--json", "--db", url, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout)["counts"])


def test_export_then_import_gives_a_store_with_the_same_state(tmp_path: Path) -> None:
    src, dst = f"sqlite:///{tmp_path / 'src.db'}", f"sqlite:///{tmp_path / 'dst.db'}"
    asyncio.run(_fill(src))
    out = tmp_path / "state.jsonl"
    result = run_statekeel("export", str(out), "--db", src, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "exported 15 records" in " ".join(result.stdout.split())
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    again = run_statekeel("export", str(out), "--db", src, cwd=tmp_path)
    assert "exists" in one_line_error(again) and "--force" in one_line_error(again)
    assert run_statekeel("export", str(out), "--db", src, "--force", cwd=tmp_path).returncode == 0
    result = run_statekeel("import", str(out), "--db", dst, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["records"] == 15
    assert _status(dst, tmp_path) == _status(src, tmp_path)
    assert run_statekeel("audit", "verify", "--db", dst, cwd=tmp_path).returncode == 0
    twice = run_statekeel("import", str(out), "--db", dst, cwd=tmp_path)
    assert "audit log has 1 already" in one_line_error(twice)


def test_export_of_one_session_and_one_kind(tmp_path: Path) -> None:
    src = f"sqlite:///{tmp_path / 'src.db'}"
    asyncio.run(_fill(src))
    out = tmp_path / "one.jsonl"
    result = run_statekeel(
        "export", str(out), "--db", src, "--session", "chat-2", "--kind", "sessions", "--json", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["counts"]["sessions"] == 1 and report["counts"]["messages"] == 3
    bad = run_statekeel("export", str(tmp_path / "x.jsonl"), "--db", src, "--kind", "nope", cwd=tmp_path)
    assert "unknown kind" in one_line_error(bad)


@pytest.mark.parametrize("pairing", ["plain", "paired"])
def test_export_of_a_nats_store_is_refused_as_docs_nats_says_with_no_file_left(
    nats_url: str, tmp_path: Path, pairing: str
) -> None:
    url = nats_url if pairing == "plain" else f"{nats_url}&rest=sqlite:///{tmp_path / 'rest.db'}"

    async def fill() -> None:
        async with statekeel.open_store(url) as store, store.sessions.open("chat") as session:
            session.add_message("user", "hello")

    asyncio.run(fill())
    out = tmp_path / "state.jsonl"
    error = one_line_error(run_statekeel("export", str(out), "--db", url, cwd=tmp_path))
    assert "Unsupported" in error and "not rows" in error
    assert "NATS's own tools" in error and "memory" not in error
    assert sorted(p.name for p in tmp_path.iterdir() if "state" in p.name) == []


def test_a_truncated_file_is_refused_and_no_store_is_created(tmp_path: Path) -> None:
    src = f"sqlite:///{tmp_path / 'src.db'}"
    asyncio.run(_fill(src))
    out = tmp_path / "state.jsonl"
    assert run_statekeel("export", str(out), "--db", src, cwd=tmp_path).returncode == 0
    out.write_bytes(out.read_bytes()[:-30])
    result = run_statekeel("import", str(out), "--db", f"sqlite:///{tmp_path / 'new.db'}", cwd=tmp_path)
    assert "ExportCorrupt" in one_line_error(result)
    assert not any(p.name.startswith("new.db") for p in tmp_path.iterdir())


def test_erase_counts_deletes_and_records_the_erasure(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'src.db'}"
    asyncio.run(_fill(url))
    dry = run_statekeel("erase", SUBJECT, "--db", url, "--actor", "dpo", "--reason", "r1", "--dry-run",
                        "--json", cwd=tmp_path)  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    preview = json.loads(dry.stdout)
    assert preview["sessions"] == 2 and preview["messages"] == 6 and preview["memories"] == 1
    assert preview["audit_seq"] is None
    assert _status(url, tmp_path)["sessions"] == {"active": 3, "expired": 0, "archived": 0}
    done = run_statekeel("erase", SUBJECT, "--db", url, "--actor", "dpo", "--reason", "r1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "deleted 10 records and files" in " ".join(done.stdout.split())
    assert _status(url, tmp_path)["sessions"] == {"active": 1, "expired": 0, "archived": 0}
    assert run_statekeel("audit", "verify", "--db", url, cwd=tmp_path).returncode == 0
    empty = run_statekeel("erase", "", "--db", url, "--actor", "dpo", "--reason", "r", cwd=tmp_path)
    assert "subject is empty" in one_line_error(empty)
    nothing = run_statekeel("erase", "nobody", "--db", url, "--actor", "dpo", "--reason", "r", "--json",
                            cwd=tmp_path)  # fmt: skip
    assert nothing.returncode == 0 and json.loads(nothing.stdout)["sessions"] == 0
    no_reason = run_statekeel("erase", SUBJECT, "--db", url, "--actor", "dpo", cwd=tmp_path)
    assert "--reason" in one_line_error(no_reason)


def test_erase_held_up_by_a_reader_says_what_is_left_and_exits_1_until_run_again(tmp_path: Path) -> None:
    db = tmp_path / "src.db"
    url = f"sqlite:///{db}"
    asyncio.run(_fill(url))
    reader = sqlite3.connect(db, isolation_level=None)  # another process's long read
    try:
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM messages").fetchone()[0] == 9
        held = run_statekeel("erase", SUBJECT, "--db", url, "--actor", "dpo", "--reason", "r1", "--wait", "0",
                             cwd=tmp_path)  # fmt: skip
        assert held.returncode == 1
        assert "deleted 10 records and files" in " ".join(held.stdout.split())
        said = " ".join(held.stderr.split())
        assert "erasure incomplete" in said and "write-ahead log" in said and "run the erasure again" in said
        assert "Traceback" not in held.stderr
    finally:
        reader.execute("ROLLBACK")
        reader.close()
    done = run_statekeel("erase", SUBJECT, "--db", url, "--actor", "dpo", "--reason", "r1", "--json",
                         cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["complete"] is True and report["left"] == "" and report["sessions"] == 0


def test_erase_with_a_key_ring_destroys_the_subjects_data_keys_so_a_backup_no_longer_reads(
    tmp_path: Path,
) -> None:
    key = bytes(range(32))
    key_file = tmp_path / "store.key"
    key_file.write_text(key.hex() + "\n")
    key_file.chmod(0o600)
    ring = tmp_path / "keys" / "ring.db"
    made = run_statekeel("create-keyring", str(ring), "--key-file", str(key_file), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE(ring.stat().st_mode) == 0o600
    again = run_statekeel("create-keyring", str(ring), "--key-file", str(key_file), cwd=tmp_path)
    assert "never overwritten" in one_line_error(again)
    assert "needs the store's keys" in one_line_error(run_statekeel("create-keyring", "x.db", cwd=tmp_path))
    url = f"sqlite:///{tmp_path / 'src.db'}"

    async def fill_and_back_up() -> None:
        async with statekeel.open_store(url, encryption_key=key, keyring=str(ring)) as store:
            async with store.sessions.open("chat-1") as session:
                session.metadata["subject"] = SUBJECT
                session.add_message("user", "alice's words")
            await store.backup(tmp_path / "before.db")

    asyncio.run(fill_and_back_up())
    env = {"STATEKEEL_KEY_FILE": str(key_file), "STATEKEEL_KEYRING": str(ring)}
    done = run_statekeel("erase", SUBJECT, "--db", url, "--actor", "dpo", "--reason", "r1", "--json",
                         cwd=tmp_path, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["data_keys"] == 1
    old = f"sqlite:///{tmp_path / 'before.db'}"
    show = run_statekeel("--keyring", str(ring), "show", "chat-1", "--db", old, cwd=tmp_path, env=env)
    assert "erased" in one_line_error(show)
    missing = run_statekeel("--keyring", str(tmp_path / "nowhere.db"), "show", "chat-1", "--db", old,
                            cwd=tmp_path, env={"STATEKEEL_KEY_FILE": str(key_file)})  # fmt: skip
    assert "does not exist" in one_line_error(missing)
