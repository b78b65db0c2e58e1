"""Fallback files: names, atomic writes, permissions, exact round trip, corruption detection, and
replacing or deleting only the file whose signature the caller holds."""

from __future__ import annotations

import datetime as dt
import os
import stat
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from statekeel import fallback as fb
from statekeel.codec import Codec
from statekeel.fallback import (
    FallbackChanged,
    FallbackCorrupt,
    FallbackDir,
    FallbackSnapshot,
    default_dir,
    file_stem,
)

NASTY_KEYS = ["a:b", "a_b", "a/b", "../x", "é", "A", "a", "a-b", "a.b", "..", "k" * 500, "k" * 499 + "é"]


def snapshot(key: str, messages: list[dict[str, Any]], base: int = 0) -> FallbackSnapshot:
    now = dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    return FallbackSnapshot(
        key=key,
        base_head=base,
        in_backend=base > 0,
        status="active",
        metadata={"owner": "ann", "at": now},
        status_changed=False,
        metadata_changed=True,
        last_consolidated=0,
        created_at=now,
        updated_at=now,
        messages=messages,
    )


def test_file_names_of_tricky_keys_never_collide_and_stay_plain_names() -> None:
    stems = [file_stem(k) for k in NASTY_KEYS]
    assert len(set(stems)) == len(NASTY_KEYS)
    # Case-insensitive file systems too.
    assert len({s.lower() for s in stems}) == len(NASTY_KEYS)
    for stem in stems:
        assert "/" not in stem and "\\" not in stem and stem not in (".", "..")
        assert len(stem.encode()) + len(fb.SUFFIX) + 40 <= 255


def test_tricky_keys_write_distinct_files_inside_the_directory(tmp_path: Path) -> None:
    d = FallbackDir(tmp_path / "fb", Codec())
    for i, key in enumerate(NASTY_KEYS):
        d.write(snapshot(key, [{"role": "user", "content": i}]))
    names = os.listdir(tmp_path / "fb")
    assert len(names) == len(NASTY_KEYS)
    assert sorted(os.listdir(tmp_path)) == ["fb"]  # nothing escaped the directory
    for i, key in enumerate(NASTY_KEYS):
        snap = d.read(key)
        assert snap is not None and snap.key == key and snap.messages == [{"role": "user", "content": i}]


def test_round_trip_keeps_exact_values_of_messages_and_metadata(tmp_path: Path) -> None:
    d = FallbackDir(tmp_path, Codec())
    messages = [
        {"role": "user", "content": "line one\nline two"},
        {"role": "tool", "content": b"\x00\xff", "id": uuid.UUID(int=7), "cost": Decimal("0.10")},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "$sk": "not a tag"}]},
    ]
    original = snapshot("s", messages, base=5)
    d.write(original)
    assert d.read("s") == original


def test_files_and_directory_are_owner_only(tmp_path: Path) -> None:
    d = FallbackDir(tmp_path / "fb", Codec())
    path = d.write(snapshot("s", [{"role": "user", "content": "x"}]))
    assert stat.S_IMODE(os.stat(tmp_path / "fb").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_old_file_survives_when_os_replace_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = FallbackDir(tmp_path, Codec())
    d.write(snapshot("s", [{"role": "user", "content": "old"}]))

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fb.os, "replace", failing_replace)
    with pytest.raises(OSError):
        d.write(snapshot("s", [{"role": "user", "content": "new"}]))
    monkeypatch.undo()
    snap = d.read("s")
    assert snap is not None and snap.messages == [{"role": "user", "content": "old"}]
    assert os.listdir(tmp_path) == [file_stem("s") + fb.SUFFIX]  # no temp file left behind


def test_successful_writes_leave_no_temp_files(tmp_path: Path) -> None:
    d = FallbackDir(tmp_path, Codec())
    for i in range(5):
        d.write(snapshot("s", [{"role": "user", "content": i}]))
    assert os.listdir(tmp_path) == [file_stem("s") + fb.SUFFIX]


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[:-1],  # torn: no final newline
        lambda raw: raw.replace(b'"content":1', b'"content":1,,', 1),  # a bad line
        lambda raw: raw + b'{"role":"user","content":2}\n',  # more lines than the header counts
        lambda raw: b"{}\n" + raw.split(b"\n", 1)[1],  # no header
    ],
)
def test_damaged_file_is_refused_as_corrupt(tmp_path: Path, damage: Any) -> None:
    d = FallbackDir(tmp_path, Codec())
    path = d.write(snapshot("s", [{"role": "user", "content": 1}]))
    raw = Path(path).read_bytes()
    Path(path).write_bytes(damage(raw))
    with pytest.raises(FallbackCorrupt):
        d.read("s")


def test_file_of_one_key_renamed_to_another_key_is_refused(tmp_path: Path) -> None:
    d = FallbackDir(tmp_path, Codec())
    path = d.write(snapshot("a", [{"role": "user", "content": 1}]))
    os.replace(path, d.file_for("b"))
    with pytest.raises(FallbackCorrupt):
        d.read("b")


def test_quarantine_renames_the_file_aside_and_files_no_longer_lists_it(tmp_path: Path) -> None:
    d = FallbackDir(tmp_path, Codec())
    path = d.write(snapshot("a", [{"role": "user", "content": 1}]))
    target = d.quarantine(path, "test")
    assert os.path.exists(target) and not os.path.exists(path)
    assert list(d.files()) == []


def test_delete_with_a_stale_signature_keeps_the_newer_file(tmp_path: Path) -> None:
    d = FallbackDir(tmp_path, Codec())
    d.write(snapshot("a", [{"role": "user", "content": 1}]))
    old = d.signature("a")
    d.write(snapshot("a", [{"role": "user", "content": 1}, {"role": "user", "content": 2}]))
    assert d.delete("a", old) is False
    assert d.read("a") is not None


def test_default_directories() -> None:
    assert default_dir("memory://") is None
    assert default_dir("sqlite:///data/agent.db") == "data/agent.db.fallback"
    assert default_dir("sqlite:////var/lib/agent.db") == "/var/lib/agent.db.fallback"
    pg = default_dir("postgresql://u:secret@db.example:5433/agents")
    assert pg is not None and "secret" not in pg and pg.endswith(file_stem("db.example_5433_agents"))


def test_a_write_replaces_only_the_file_whose_signature_it_was_given(tmp_path: Path) -> None:
    d = FallbackDir(tmp_path, Codec())
    with pytest.raises(FallbackChanged):
        d.write_signed(snapshot("a", [{"role": "user", "content": 1}]), replacing="some-file")  # none there
    _, first = d.write_signed(snapshot("a", [{"role": "user", "content": 1}]), replacing=None)
    assert d.read_signed("a") == (d.read("a"), first)
    _, second = d.write_signed(snapshot("a", [{"role": "user", "content": 2}]), replacing=first)
    assert second != first and d.signature("a") == second
    with pytest.raises(FallbackChanged) as info:  # another writer's file: never replaced blindly
        d.write_signed(snapshot("a", [{"role": "user", "content": 3}]), replacing=first)
    assert info.value.current == second
    with pytest.raises(FallbackChanged):
        d.write_signed(snapshot("a", [{"role": "user", "content": 3}]), replacing=None)
    snap = d.read("a")
    assert snap is not None and snap.messages == [{"role": "user", "content": 2}]
    assert d.quarantine(d.file_for("a"), "stale", first) is None  # not the file that was judged
    assert d.read("a") is not None and d.delete("a", second) and d.read("a") is None


def test_a_file_without_a_write_id_is_signed_by_its_inode_size_and_time(tmp_path: Path) -> None:
    d = FallbackDir(tmp_path, Codec())
    path = Path(d.write(snapshot("a", [{"role": "user", "content": 1}])))
    header, rest = path.read_bytes().split(b"\n", 1)
    fields = orjson.loads(header)
    del fields["write_id"]  # as an earlier statekeel wrote it
    path.write_bytes(orjson.dumps(fields) + b"\n" + rest)
    found = d.read_signed("a")
    assert found is not None and found[1].startswith("stat:") and found[1] == d.signature("a")
    assert d.delete("a", found[1])


def test_a_write_fsyncs_the_file_then_renames_it_then_fsyncs_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order that makes a fallback file survive a power cut: its bytes reach the disk before the
    rename makes it the key's file, and the directory entry after — without the last fsync, the rename
    itself can be lost and the session's messages with it."""
    d = FallbackDir(tmp_path, Codec())
    d.write(snapshot("s", [{"role": "user", "content": "old"}]))
    target = d.file_for("s")
    events: list[tuple[str, str]] = []
    real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            events.append(("fsync dir", str(tmp_path) if os.path.samestat(st, os.stat(tmp_path)) else "?"))
        else:
            # Which file: the one whose inode is this descriptor's (the temporary file, before the rename).
            named = [p.name for p in tmp_path.iterdir() if os.path.samestat(st, p.stat())]
            events.append(("fsync file", named[0] if named else "?"))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        events.append(("rename", f"{os.path.basename(src)} -> {os.path.basename(dst)}"))
        real_replace(src, dst)

    def rename(src: str, dst: str) -> None:
        events.append(("rename", f"{os.path.basename(src)} -> {os.path.basename(dst)}"))
        real_rename(src, dst)

    monkeypatch.setattr(fb.os, "fsync", fsync)
    monkeypatch.setattr(fb.os, "replace", replace)
    monkeypatch.setattr(fb.os, "rename", rename)
    d.write(snapshot("s", [{"role": "user", "content": "new"}]))
    monkeypatch.undo()
    kinds = [kind for kind, _ in events]
    assert kinds == ["fsync file", "rename", "fsync dir"], events
    tmp_name = events[0][1]
    assert tmp_name != os.path.basename(target) and tmp_name != "?"
    assert events[1][1] == f"{tmp_name} -> {os.path.basename(target)}"
    assert events[2][1] == str(tmp_path)
    snap = d.read("s")
    assert snap is not None and snap.messages == [{"role": "user", "content": "new"}]


def test_a_delete_fsyncs_the_directory_after_removing_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = FallbackDir(tmp_path, Codec())
    d.write(snapshot("s", [{"role": "user", "content": "old"}]))
    target = d.file_for("s")
    events: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        events.append(f"fsync {'dir' if is_dir else 'file'} (file there: {os.path.exists(target)})")
        real_fsync(fd)

    monkeypatch.setattr(fb.os, "fsync", fsync)
    assert d.delete("s")
    monkeypatch.undo()
    assert events == ["fsync dir (file there: False)"]
