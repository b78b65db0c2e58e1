"""After store.erase, the subject's text is not in the SQLite database file, its WAL or the fallback
directory any more: the rows are overwritten (secure_delete), the WAL checkpointed and truncated, the
fallback files removed. The test reads the bytes on disk. With a key ring, an erasure killed by SIGKILL
at any point is finished by the next run, and a backup taken before no longer opens the subject's data."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path

import pytest

import statekeel
from helpers import kill9_when
from statekeel.fallback import FallbackSnapshot

MARK = "Zanzibar-Quokka-7f3a"  # the subject's text: its name, in its key, metadata, messages, memories


def _holders(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and MARK.encode() in p.read_bytes()
    )


async def test_the_subjects_text_is_gone_from_the_database_file_wal_and_fallback_files(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    root.mkdir()
    url = f"sqlite:///{root / 'agent.db'}"
    subject = f"user:{MARK}"
    async with statekeel.open_store(url) as store:
        for i in range(30):
            key = subject if i == 0 else f"chat-{i}"
            session = await store.sessions.get_or_create(key)
            session.metadata["subject"] = subject if i < 10 else "someone-else"
            for t in range(20):
                text = f"{MARK} said {t} " * 20 if i < 10 else f"other talk {t} " * 20
                session.add_message("user", text)
                await store.sessions.save(session)  # many small saves: rows rewritten again and again
        await store.sessions.compress("chat-1", 10, f"summary about {MARK}")
        await store.memory.put("user", "name", f"{MARK} v1", scope=subject)
        await store.memory.put("user", "name", f"{MARK} v2", scope=subject)  # an update: history
        await store.memory.relate(subject, "lives in", "Lyon")
        await store.memory.add_episode("chat-2", f"{MARK} booked a trip")
        await store.files.record(f"notes/{MARK}.txt", "ab" * 32, 3, session_key="chat-3")
        now = dt.datetime.now(dt.UTC)
        store.traces.record(
            "chat-4",
            {"span_id": "s", "name": "llm", "kind": "llm", "status": "ok", "started_at": now,
             "attributes": {"prompt": MARK}},
        )  # fmt: skip
        fallback = store.sessions.fallback
        assert fallback is not None
        snap = FallbackSnapshot(
            "only-on-disk", 0, False, "active", {"subject": subject}, True, True, 0, now, now,
            [{"role": "user", "content": f"{MARK} offline"}],
        )  # fmt: skip
        fallback.write(snap)
        assert {"agent.db", "agent.db-wal"} & set(_holders(root))

        report = await store.erase(subject, actor="dpo", reason="request 113")
        assert report.sessions == 10 and report.fallback_files == 1 and report.memories == 1
        # Still open: the database and its WAL no longer hold the text.
        assert _holders(root) == []
        others = await store.sessions.load("chat-20")
        assert others is not None and len(others.messages) == 20
    assert _holders(root) == []


async def _a_subject_with_text(store: statekeel.Store, subject: str) -> None:
    for i in range(3):
        key = subject if i == 0 else f"chat-{i}"
        session = await store.sessions.get_or_create(key)
        session.metadata["subject"] = subject if i < 2 else "someone-else"
        for t in range(10):
            session.add_message("user", f"{MARK} said {t} " * 10 if i < 2 else f"other talk {t}")
        await store.sessions.save(session)
    await store.memory.put("user", "name", f"{MARK} v1", scope=subject)


async def test_an_erasure_a_reader_holds_up_says_it_is_incomplete_and_the_next_run_finishes_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    root.mkdir()
    db = root / "agent.db"
    subject = f"user:{MARK}"
    async with statekeel.open_store(f"sqlite:///{db}", busy_timeout_ms=50) as store:
        await _a_subject_with_text(store, subject)
        # Another process's long read: a snapshot taken before the erasure, held past busy_timeout.
        reader = sqlite3.connect(db, isolation_level=None)
        try:
            reader.execute("BEGIN")
            assert reader.execute("SELECT count(*) FROM messages").fetchone()[0] == 30
            report = await store.erase(subject, actor="dpo", reason="request 113", log_wait=0.3)
            assert report.sessions == 2 and report.memories == 1  # the rows are deleted
            assert not report.complete
            assert "write-ahead log" in report.left and "run the erasure again" in report.advice
            entry = (await store.audit.query(kind="erasure"))[-1]
            assert entry.seq == report.audit_seq and entry.data["complete"] is False
            # What the report says is left is on disk: the erased text, in the file or its log.
            assert _holders(root) != []
            assert await store.sessions.load(subject) is None
        finally:
            reader.execute("ROLLBACK")
            reader.close()
        again = await store.erase(subject, actor="dpo", reason="request 113, after the reader")
        assert again.complete and again.left == "" and again.advice == "" and again.total == 0
        assert (await store.audit.query(kind="erasure"))[-1].data["complete"] is True
        assert _holders(root) == []  # no byte of the subject's text in agent.db or agent.db-wal
        others = await store.sessions.load("chat-2")
        assert others is not None and len(others.messages) == 10
    assert _holders(root) == []


async def test_an_erasure_no_reader_holds_up_is_complete_on_disk(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    subject = f"user:{MARK}"
    async with statekeel.open_store(f"sqlite:///{root / 'agent.db'}", busy_timeout_ms=50) as store:
        await _a_subject_with_text(store, subject)
        assert _holders(root) != []
        report = await store.erase(subject, actor="dpo", reason="request 113", log_wait=0)
        assert report.complete and report.left == "" and _holders(root) == []


ERASE_CHILD = """
import asyncio, os, sys, time
import statekeel
from statekeel.codec.keyring import KeyRing

url, ring, point, reached = sys.argv[1:5]


def hang():
    open(reached, "w").close()  # the parent kills this process now
    time.sleep(120)


async def main():
    store = await statekeel.open_store(url, encryption_key=bytes(range(32)), keyring=ring)
    if point == "before-rows":  # the keys to destroy are marked; no row has gone
        async def stuck(*args, **kwargs):
            hang()
        store.backend.erase_sessions = stuck
    if point == "before-keys":  # the rows are gone; the keys are not destroyed
        KeyRing.destroy = lambda self, *args: hang()
    if point == "before-audit":  # the keys are destroyed; the audit entry is not written
        real = store.audit.append
        async def append(kind, *args, **kwargs):
            if kind == "erasure":
                hang()
            return await real(kind, *args, **kwargs)
        store.audit.append = append
    await store.erase("user:alice", actor="dpo", reason="request 113")

asyncio.run(main())
"""


@pytest.mark.parametrize("point", ["before-rows", "before-keys", "before-audit"])
async def test_an_erasure_with_a_key_ring_killed_by_sigkill_is_finished_by_the_next_run(
    shared_url: str, tmp_path: Path, point: str
) -> None:
    key = bytes(range(32))
    ring = await statekeel.create_keyring(tmp_path / "keys" / "ring.db", key)
    async with statekeel.open_store(shared_url, encryption_key=key, keyring=ring) as store:
        for name, subject in (("user:alice", "user:alice"), ("chat-1", "user:alice"), ("chat-2", "bob")):
            async with store.sessions.open(name) as session:
                session.metadata["subject"] = subject
                session.add_message("user", f"{MARK} from {name}")
        await store.backup(tmp_path / "before.db")
    reached = tmp_path / "reached"
    kill9_when([ERASE_CHILD, shared_url, ring, point, str(reached)], reached.exists, point)
    async with statekeel.open_store(shared_url, encryption_key=key, keyring=ring) as store:
        report = await store.erase("user:alice", actor="dpo", reason="request 113")
        assert report.sessions == (2 if point == "before-rows" else 0)
        assert report.data_keys == (0 if point == "before-audit" else 2)
        assert len(await store.audit.query(kind="erasure")) == 1
        assert await store.sessions.load("chat-1") is None
    async with statekeel.open_store(
        f"sqlite:///{tmp_path / 'before.db'}", encryption_key=key, keyring=ring
    ) as old:
        for name in ("user:alice", "chat-1"):
            with pytest.raises(statekeel.SubjectErased):
                await old.sessions.load(name)
        bob = await old.sessions.load("chat-2")
        assert bob is not None and [m["content"] for m in bob.messages] == [f"{MARK} from chat-2"]
