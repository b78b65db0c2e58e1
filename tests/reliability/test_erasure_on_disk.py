"""After store.erase, the subject's text is not in the SQLite database file, its WAL or the fallback
directory any more: the rows are overwritten (secure_delete), the WAL checkpointed and truncated, the
fallback files removed. The test reads the bytes on disk."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import statekeel
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
