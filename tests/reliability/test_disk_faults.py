"""Faults of the disk under a SQLite store: the disk fills up, and the fallback writer's fsync or rename
fails. A write that fails raises a typed error and leaves what was written before intact and loadable; a
session save that the database refused goes to its fallback file when that can be written, and raises
only when neither can; once space is back, everything waiting is replayed."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import statekeel
from helpers import contents, database_write_locked, sqlite_url

PAD = "p" * 2000


@contextlib.contextmanager
def small_tmpfs(tmp_path: Path, size: str = "3m") -> Iterator[Path | None]:
    """A tmpfs of ``size`` mounted under ``tmp_path`` (root only), or None where one cannot be mounted."""
    mount = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    if os.geteuid() != 0:
        yield None
        return
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        yield None
        return
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


async def _fill_until_full(store: statekeel.Store) -> int:
    """Append to session "filler" until the database refuses; the number of messages written."""
    b = store.backend
    head = 0
    while True:
        try:
            record = await b.append_messages("filler", head, [_msg(store, f"{head} {PAD}")], create=head == 0)
        except statekeel.BackendUnavailable as exc:
            assert "full" in str(exc).lower(), exc
            return head
        head = record.head_seq
        assert head < 100_000, "the disk never filled"


def _msg(store: statekeel.Store, content: Any) -> statekeel.backends.base.NewMessage:
    from helpers import message

    return message(store, content)


@contextlib.asynccontextmanager
async def _nearly_full_store(tmp_path: Path, how: str) -> Any:
    """A store whose database cannot grow much: on a small tmpfs (``how="tmpfs"``, when one can be
    mounted), else capped with SQLite's max_page_count (what a full disk looks like to SQLite). Yields the
    store and a function that gives room back."""
    with small_tmpfs(tmp_path) as mounted:
        if how == "tmpfs" and mounted is None:
            pytest.skip("no tmpfs can be mounted here (it needs root); the max_page_count case runs")
        mount = mounted if how == "tmpfs" else None
        db = (mount or tmp_path) / "agent.db"
        store = await statekeel.open_store(sqlite_url(db), fallback_dir=os.fspath(tmp_path / "fallback"))
        backend = store.backend
        filler = None if mount is None else mount / "filler"
        try:
            if filler is not None:
                # Leave the database about 200 kB to grow into.
                free = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
                with open(filler, "wb") as fh:
                    fh.write(b"\0" * max(0, free - 200_000))
            else:
                pages = await backend._call(
                    backend._writer, lambda c: c.execute("PRAGMA page_count").fetchone()[0]
                )  # type: ignore[attr-defined]
                await backend._call(
                    backend._writer, lambda c: c.execute(f"PRAGMA max_page_count = {pages + 50}")
                )  # type: ignore[attr-defined]

            async def make_room() -> None:
                if filler is not None:
                    os.unlink(filler)
                else:
                    await backend._call(
                        backend._writer, lambda c: c.execute("PRAGMA max_page_count = 1073741823")
                    )  # type: ignore[attr-defined]

            yield store, make_room
        finally:
            await store.close()


@pytest.mark.parametrize("how", ["tmpfs", "max_page_count"])
async def test_a_full_disk_refuses_writes_with_a_typed_error_and_keeps_what_was_written(
    tmp_path: Path, how: str
) -> None:
    async with _nearly_full_store(tmp_path, how) as (store, make_room):
        session = await store.sessions.get_or_create("agent")
        session.add_message("user", "before the disk filled")
        await store.sessions.save(session)
        task = await store.tasks.create("deploy", status="queued")
        written = await _fill_until_full(store)
        assert written > 0
        # Every kind of write is refused with BackendUnavailable; none is half done.
        with pytest.raises(statekeel.BackendUnavailable):
            await store.tasks.create("another", description=PAD * 10)
        with pytest.raises(statekeel.BackendUnavailable):
            await store.audit.append("tool.call", "agent", "task:1", {"pad": PAD * 10})
        # A session save falls back to its file (on another disk) and is loaded from it.
        session.add_message("user", "while the disk was full " + PAD * 5)
        await store.sessions.save(session)
        reloaded = await store.sessions.load("agent")
        assert reloaded is not None and [m["content"][:24] for m in reloaded.messages] == [
            "before the disk filled",
            "while the disk was full ",
        ]
        # Reads work, and what was written before is all there.
        assert (await store.tasks.get(task.id)) == task
        assert len(await store.backend.read_messages("filler")) == written
        # Only the first task's creation is audited: the refused create and append left no entry.
        assert [e.kind for e in await store.audit.query()] == ["task.created"]

        await make_room()
        report = await store.recover()
        assert report.fallback is not None and report.fallback.replayed
        assert [c[:24] for c in await contents(store, "agent")] == [
            "before the disk filled",
            "while the disk was full ",
        ]
        assert report.integrity_problems == [] and report.ok, report.summary()
        await store.audit.append("tool.call", "agent", "task:1", {"n": 1})


async def _locked_save(store: statekeel.Store, db: Path, session: statekeel.Session, text: str) -> None:
    with database_write_locked(db):
        session.add_message("user", text)
        await store.sessions.save(session)


@pytest.mark.parametrize("failing", ["fsync", "replace"])
async def test_a_failing_fsync_or_rename_in_the_fallback_writer_raises_and_keeps_the_older_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    db, fallback = tmp_path / "agent.db", tmp_path / "fallback"
    async with statekeel.open_store(
        sqlite_url(db), fallback_dir=os.fspath(fallback), busy_timeout_ms=50
    ) as store:
        session = await store.sessions.get_or_create("agent")
        session.add_message("user", "saved")
        await store.sessions.save(session)
        await _locked_save(store, db, session, "in the fallback file")
        [older] = os.listdir(fallback)
        before = (fallback / older).read_bytes()

        real = getattr(os, failing)

        def broken(*args: Any) -> Any:
            raise OSError(errno.EIO, f"{failing} failed (injected)")

        monkeypatch.setattr(os, failing, broken)
        with pytest.raises(statekeel.BackendUnavailable) as info:
            await _locked_save(store, db, session, "neither here nor there")
        monkeypatch.setattr(os, failing, real)
        assert "not saved" in str(info.value)
        # The older fallback file is whole and still what a load sees; no temporary file is left.
        assert os.listdir(fallback) == [older]
        assert (fallback / older).read_bytes() == before
        loaded = await statekeel.SessionManager(
            store.backend, store.codec, fallback_dir=os.fspath(fallback)
        ).load("agent")
        assert loaded is not None and [m["content"] for m in loaded.messages] == [
            "saved",
            "in the fallback file",
        ]
        # The unsaved message is still in the session: the next save writes everything.
        await store.sessions.save(session)
        assert await contents(store, "agent") == ["saved", "in the fallback file", "neither here nor there"]
