"""copy_store killed with SIGKILL in the middle: the destination holds whole batches only, and
``resume=True`` finishes the copy exactly."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import asyncpg
import pytest

import statekeel
from statekeel.backends.base import NewMessage

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

SESSIONS, TURNS = 300, 6


async def _populate(url: str) -> None:
    async with statekeel.open_store(url) as store:

        async def one(i: int) -> None:
            head = 0
            for t in range(TURNS):
                msgs = [
                    NewMessage(role, store.codec.encode({"role": role, "content": f"{i}-{t}-{role}"}))
                    for role in ("user", "assistant")
                ]
                head = (await store.backend.append_messages(f"k{i:04d}", head, msgs, create=True)).head_seq

        await asyncio.gather(*(one(i) for i in range(SESSIONS)))


async def test_copy_killed_mid_way_resumes_to_an_exact_copy(tmp_path: Path, pg_migrated: str) -> None:
    src = f"sqlite:///{tmp_path / 'src.db'}"
    await _populate(src)
    total = SESSIONS * TURNS * 2
    script = (
        "import asyncio, sys, statekeel\n"
        "asyncio.run(statekeel.copy_store(sys.argv[1], sys.argv[2], batch_size=3))\n"
    )
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", script, src, pg_migrated)
    watcher = await asyncpg.connect(pg_migrated)
    try:
        end = time.monotonic() + 60
        while not await watcher.fetchval("SELECT count(*) FROM messages"):
            if time.monotonic() > end or proc.returncode is not None:
                pytest.fail(f"the copy never reached the messages (exit code {proc.returncode})")
            await asyncio.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        code = await proc.wait()
        # The server may still be finishing the killed client's last COMMIT: count once its backends
        # are gone, so that the count is final.
        end = time.monotonic() + 30
        while await watcher.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ):
            if time.monotonic() > end:
                pytest.fail("the killed copy's server connections did not go away within 30 s")
            await asyncio.sleep(0.005)
        copied = await watcher.fetchval("SELECT count(*) FROM messages")
        assert code == -signal.SIGKILL, f"the copy ended by itself (exit {code}, {copied}/{total} messages)"
        assert 0 < copied < total, copied  # really interrupted mid-way
        assert copied % 3 == 0, copied  # whole batches only
        sessions_copied = await watcher.fetchval("SELECT count(*) FROM sessions")
        assert sessions_copied == SESSIONS, sessions_copied  # sessions come first and were complete
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await watcher.close()

    with pytest.raises(statekeel.ConflictError):
        await statekeel.copy_store(src, pg_migrated)
    report = await statekeel.copy_store(src, pg_migrated, resume=True, batch_size=500)
    assert report.verified
    by_table = {t.table: t for t in report.tables}
    assert by_table["messages"].copied == total - copied
    async with statekeel.open_store(src) as s, statekeel.open_store(pg_migrated) as d:
        for i in range(0, SESSIONS, 7):
            assert await d.backend.load_session_with_messages(
                f"k{i:04d}"
            ) == await s.backend.load_session_with_messages(f"k{i:04d}")
        msgs = await d.backend.read_messages(f"k{SESSIONS - 1:04d}")
        assert [m.seq for m in msgs] == list(range(TURNS * 2))
