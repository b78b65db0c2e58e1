"""``store.backup(dest)`` on every backend: an owner-only SQLite file holding every kind of state, never
written over an existing file, nothing left behind when it is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import statekeel

Store = statekeel.Store


async def test_backup_writes_an_owner_only_sqlite_copy_of_every_kind(store: Store, tmp_path: Path) -> None:
    async with store.sessions.open("chat") as session:
        session.add_message("user", "hello")
    task = await store.tasks.create("build")  # audited: one entry
    await store.audit.append("note", "tester", "chat", {"n": 1})
    out = tmp_path / "out"
    out.mkdir()
    dest = out / "backup.db"
    report = await store.backup(dest)
    assert report.path == str(dest) and report.bytes == dest.stat().st_size > 0
    assert dest.stat().st_mode & 0o777 == 0o600
    assert os.listdir(out) == ["backup.db"]  # one self-contained file: no -wal or -shm left
    async with statekeel.open_store(f"sqlite:///{dest}", migrate=False) as copy:
        loaded = await copy.sessions.snapshot("chat")
        assert loaded is not None and loaded.messages == [{"role": "user", "content": "hello"}]
        assert (await copy.tasks.get(task.id)) is not None
        verification = await copy.audit.verify()
        assert verification.ok and verification.count == len(await store.audit.query()) == 2


async def test_backup_never_overwrites_a_file_and_leaves_nothing_when_it_fails(
    store: Store, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    dest = out / "taken.db"
    dest.write_bytes(b"mine")
    with pytest.raises(statekeel.InvalidArgument, match="already exists"):
        await store.backup(dest)
    assert dest.read_bytes() == b"mine"
    with pytest.raises(statekeel.InvalidArgument, match="does not exist"):
        await store.backup(out / "no-such-dir" / "b.db")
    with pytest.raises(statekeel.InvalidArgument):
        await store.backup("")
    if store.url.startswith("sqlite:"):
        with pytest.raises(statekeel.InvalidArgument, match="already exists"):
            await store.backup(store.url.removeprefix("sqlite:///"))  # its own file
    assert os.listdir(out) == ["taken.db"]
