"""Review of store.recover(): one session that cannot be loaded must not stop the repair of the others, nor
the rest of the recovery (task leases, the report)."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path

import statekeel
from statekeel.recovery import INTERRUPTED_CONTENT


async def _with_unanswered_call(store: statekeel.Store, key: str) -> None:
    session = await store.sessions.get_or_create(key)
    session.add_message("user", "run the tests")
    session.add_message("assistant", None, tool_calls=[{"id": "c1", "type": "function"}])
    await store.sessions.save(session)


async def test_a_session_with_a_damaged_history_is_reported_and_recovery_goes_on(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    url = f"sqlite:///{db}"
    async with statekeel.open_store(url) as store:
        for key in ("a-first", "damaged", "z-last"):
            await _with_unanswered_call(store, key)
        task = await store.tasks.create("build", status="queued")
        assert await store.tasks.claim("w1", lease_seconds=30) is not None
    # A gap in the stored history (seq 0 lost outside statekeel): loading it is StorageCorrupt.
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("DELETE FROM messages WHERE session_key = 'damaged' AND seq = 0")
    conn.close()
    async with statekeel.open_store(url) as store:
        later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
        report = await store.recover(now=later)  # used to raise StorageCorrupt here
        assert report.orphaned_tool_calls == {"a-first": ["c1"], "z-last": ["c1"]}
        assert list(report.sessions_failed) == ["damaged"]
        assert "damaged" in report.sessions_failed["damaged"]
        assert not report.ok and report.summary()["sessions_failed"] == 1
        assert [t.id for t in report.interrupted_tasks] == [task.id]  # the task recovery still ran
        for key in ("a-first", "z-last"):
            s = await store.sessions.load(key)
            assert s is not None and s.messages[-1]["content"] == INTERRUPTED_CONTENT
        record = await store.backend.load_session("damaged")
        assert record is not None and record.head_seq == 2  # nothing was written to it
