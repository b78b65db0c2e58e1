"""``statekeel demo --stress`` as a user runs it: a subprocess, no terminal, exit code and account checked.

The verifier itself is tested against a lost and a tampered message: a demo that cannot fail proves
nothing.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Mapping
from pathlib import Path

import pytest
from click.testing import CliRunner

import statekeel
from helpers import run_statekeel
from statekeel.cli import main
from statekeel.demo import expected_message, session_key, verify
from statekeel.demo import runner as demo_runner
from statekeel.demo.verify import Verification


def test_stress_demo_kills_the_writer_and_verifies_every_acknowledged_message(tmp_path: Path) -> None:
    result = run_statekeel("demo", "--stress", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = " ".join(result.stdout.split())  # rich wraps lines at 80 columns without a terminal
    assert "killed with SIGKILL" in out
    match = re.search(r"verified: all (\d+) acknowledged messages survived the kill", out)
    assert match, out
    assert int(match.group(1)) > 0
    assert "dense sequence numbers" in out and "integrity_check: ok" in out
    for i in range(3):
        assert session_key(i) in out
    # It worked in a temporary directory it removed, not in the current one.
    assert os.listdir(tmp_path) == []
    temp_dir = re.search(r"store: (\S+)/demo\.db \(temporary", out)
    assert temp_dir and not os.path.exists(temp_dir.group(1))


def test_stress_demo_with_db_and_several_cycles_resumes_the_same_sessions(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    result = run_statekeel(
        "demo", "--stress", "--db", f"sqlite:///{db}", "--cycles", "3", "--sessions", "2", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    assert out.count("killed with SIGKILL") == 3
    assert os.stat(db).st_mode & 0o777 == 0o600
    conn = sqlite3.connect(db)
    heads = dict(conn.execute("SELECT key, head_seq FROM sessions").fetchall())
    assert set(heads) == {session_key(0), session_key(1)}
    for key, head in heads.items():
        seqs = [
            r[0] for r in conn.execute("SELECT seq FROM messages WHERE session_key = ? ORDER BY seq", (key,))
        ]
        assert seqs == list(range(head))
    conn.close()


def test_stress_demo_on_a_store_the_story_demo_used_verifies_only_its_own_sessions(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    story = run_statekeel("demo", "--db", url, "--seed", "5", cwd=tmp_path)
    assert story.returncode == 0, story.stdout + story.stderr
    conn = sqlite3.connect(tmp_path / "shared.db")
    before = dict(conn.execute("SELECT key, head_seq FROM sessions").fetchall())
    conn.close()
    assert before and not any(key.startswith("demo-agent-") for key in before)
    result = run_statekeel("demo", "--stress", "--db", url, "--sessions", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    assert "verified: all" in out and "FAILED" not in out
    for key in before:
        assert key not in out  # not the demo's: not verified, not listed
    conn = sqlite3.connect(tmp_path / "shared.db")
    after = dict(conn.execute("SELECT key, head_seq FROM sessions").fetchall())
    conn.close()
    assert {k: v for k, v in after.items() if k in before} == before  # the story's sessions untouched
    assert set(after) - set(before) == {session_key(0), session_key(1)}


def test_stress_demo_keep_leaves_an_owner_only_directory(tmp_path: Path) -> None:
    result = run_statekeel("demo", "--stress", "--keep", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    match = re.search(r"store: (\S+/demo\.db)", out)
    assert match, out
    db = Path(match.group(1))
    try:
        assert db.exists()
        assert db.parent.stat().st_mode & 0o777 == 0o700
        assert db.stat().st_mode & 0o777 == 0o600
    finally:
        for p in db.parent.iterdir():
            p.unlink()
        db.parent.rmdir()


def test_stress_demo_refuses_an_in_memory_store(tmp_path: Path) -> None:
    result = run_statekeel("demo", "--stress", "--db", "memory://", cwd=tmp_path)
    assert result.returncode == 2
    assert "another process" in result.stderr


def test_demo_refusing_a_store_url_does_not_print_its_password(tmp_path: Path) -> None:
    result = run_statekeel("demo", "--db", "mysql://agent:s3cret-pw@db.example/agent", cwd=tmp_path)
    assert result.returncode == 2
    assert "another process" in result.stderr
    assert "s3cret-pw" not in result.stderr
    assert "mysql://agent:***@db.example/agent" in result.stderr


def test_stress_demo_exits_non_zero_when_an_acknowledged_message_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real demo, with the store losing one acknowledged message between the kill and the check."""
    real = demo_runner.reopen_and_verify
    lost: list[tuple[str, int]] = []

    async def lose_one_then_verify(url: str, acked: Mapping[str, list[int]]) -> Verification:
        key = sorted(acked)[0]
        seq = acked[key][len(acked[key]) // 2]
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        conn.execute("DELETE FROM messages WHERE session_key = ? AND seq = ?", (key, seq))
        conn.commit()
        conn.close()
        lost.append((key, seq))
        return await real(url, acked)

    monkeypatch.setattr(demo_runner, "reopen_and_verify", lose_one_then_verify)
    result = CliRunner().invoke(main, ["demo", "--stress", "--db", f"sqlite:///{tmp_path / 'd.db'}"])
    assert lost, result.output
    assert result.exit_code == 1, result.output
    out = " ".join(result.output.split())
    assert "verification FAILED" in out
    assert f"1 acknowledged message lost: seq {lost[0][1]}" in out
    assert "not dense" in out


async def _store_with_demo_messages(path: Path, key: str, n: int) -> None:
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        session = await store.sessions.get_or_create(key)
        for seq in range(n):
            message = expected_message(key, seq)
            fields = {k: v for k, v in message.items() if k not in ("role", "content")}
            session.add_message(message["role"], message["content"], **fields)
        await store.sessions.save(session)


async def test_verifier_accepts_a_complete_store(tmp_path: Path) -> None:
    path = tmp_path / "v.db"
    await _store_with_demo_messages(path, "k", 8)
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        result = await verify(store, {"k": [0, 1, 2, 3]})  # 4..7 committed, not acknowledged: fine
    assert result.ok, result.all_problems()
    assert (result.acknowledged, result.stored) == (4, 8)


async def test_verifier_reports_an_acknowledged_seq_beyond_the_head(tmp_path: Path) -> None:
    path = tmp_path / "v.db"
    await _store_with_demo_messages(path, "k", 8)
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        result = await verify(store, {"k": list(range(12))})
    assert not result.ok
    assert result.all_problems() == ["k: 4 acknowledged messages lost: seq 8, 9, 10, 11"]


async def test_verifier_reports_a_missing_session(tmp_path: Path) -> None:
    path = tmp_path / "v.db"
    await _store_with_demo_messages(path, "k", 4)
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        result = await verify(store, {"k": [0, 1, 2, 3], "gone": [0]})
    assert not result.ok
    assert result.all_problems() == ["gone: session is missing"]


async def test_verifier_reports_a_tampered_message(tmp_path: Path) -> None:
    path = tmp_path / "v.db"
    await _store_with_demo_messages(path, "k", 8)
    conn = sqlite3.connect(path)
    conn.execute(
        "UPDATE messages SET payload = json_set(payload, '$.content', 'edited') "
        "WHERE session_key = 'k' AND seq = 4"
    )
    conn.commit()
    conn.close()
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        result = await verify(store, {"k": list(range(8))})
    assert not result.ok
    assert result.all_problems() == ["k: 1 message differs from what was written: seq 4"]


async def test_verifier_reports_a_gap_in_sequence_numbers(tmp_path: Path) -> None:
    path = tmp_path / "v.db"
    await _store_with_demo_messages(path, "k", 8)
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM messages WHERE session_key = 'k' AND seq = 7")
    conn.commit()
    conn.close()
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        result = await verify(store, {"k": [0, 1, 2, 3]})  # seq 7 was never acknowledged, but a gap is a gap
    assert not result.ok
    assert any("not dense" in p for p in result.all_problems())
