"""store.files: the ledger of files an agent changed, and what drifted on disk since — on every backend."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import statekeel
import statekeel.files

Store = statekeel.Store


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(root: Path, rel: str, data: bytes) -> tuple[str, int]:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return sha(data), len(data)


async def ledger_rows(store: Store) -> int:
    return await store.backend.count_rows("file_changes")


async def test_every_change_of_a_file_is_kept_in_order(store: Store) -> None:
    r1 = await store.files.record("src/app.py", sha(b"v1"), 2, task_id="t1", action="created")
    r2 = await store.files.record("src/app.py", sha(b"v2"), 2, task_id="t1", session_key="s1")
    r3 = await store.files.record("src/app.py", None, None, task_id="t2", action="deleted")
    assert [(r.seq, r.action) for r in (r1, r2, r3)] == [(1, "created"), (2, "modified"), (3, "deleted")]
    assert r1.recorded_at <= r2.recorded_at <= r3.recorded_at
    assert await store.files.list(path="src/app.py") == [r1, r2, r3]
    assert await store.files.list("t1") == [r1, r2]
    assert await store.files.list(session_key="s1") == [r2]
    assert await store.files.list("t1", session_key="s1") == [r2]
    assert await store.files.list(limit=1) == [r1]
    assert await ledger_rows(store) == 3


async def test_list_by_task_spans_paths_in_the_order_they_were_recorded(store: Store) -> None:
    b = await store.files.record("b.txt", sha(b"b"), 1, task_id="t")
    a = await store.files.record("a.txt", sha(b"a"), 1, task_id="t")
    await store.files.record("c.txt", sha(b"c"), 1, task_id="other")
    assert await store.files.list("t") == [b, a]


async def test_paths_are_stored_relative_and_normalised(store: Store, tmp_path: Path) -> None:
    assert (await store.files.record("./src//pkg/./mod.py", sha(b""), 0)).path == "src/pkg/mod.py"
    assert (await store.files.record("src/tmp/../pkg/mod.py", sha(b""), 0)).path == "src/pkg/mod.py"
    assert (await store.files.record(Path("docs") / "x.md", sha(b""), 0)).path == "docs/x.md"
    absolute = await store.files.record(tmp_path / "src" / "a.py", sha(b""), 0, root=tmp_path)
    assert absolute.path == "src/a.py"
    assert [r.seq for r in await store.files.list(path="./src/pkg/mod.py")] == [1, 2]
    assert [r.path for r in await store.files.list(path=tmp_path / "src/a.py", root=str(tmp_path))] == [
        "src/a.py"
    ]


@pytest.mark.parametrize(
    "path",
    ["../outside.txt", "a/../../outside.txt", "..", ".", "./", "/etc/passwd"],
    ids=["parent", "climbs-out", "dotdot", "dot", "dot-slash", "absolute-no-root"],
)
async def test_a_path_outside_the_root_is_refused_and_nothing_is_written(store: Store, path: str) -> None:
    with pytest.raises(statekeel.InvalidArgument):
        await store.files.record(path, sha(b"x"), 1)
    assert await ledger_rows(store) == 0


async def test_an_absolute_path_under_another_root_is_refused(store: Store, tmp_path: Path) -> None:
    with pytest.raises(statekeel.InvalidArgument, match="leaves the root"):
        await store.files.record(tmp_path.parent / "elsewhere.txt", sha(b"x"), 1, root=tmp_path)
    assert await ledger_rows(store) == 0


BadRecord = Callable[[Store], Awaitable[object]]

BAD_RECORDS: list[tuple[str, BadRecord]] = [
    ("negative-size", lambda s: s.files.record("a.txt", sha(b"x"), -1)),
    ("size-not-int", lambda s: s.files.record("a.txt", sha(b"x"), 1.5)),  # type: ignore[arg-type]
    ("size-bool", lambda s: s.files.record("a.txt", sha(b"x"), True)),
    ("checksum-not-hex", lambda s: s.files.record("a.txt", "z" * 64, 1)),
    ("checksum-too-short", lambda s: s.files.record("a.txt", "ab" * 16, 1)),
    ("checksum-not-text", lambda s: s.files.record("a.txt", b"\x00" * 32, 1)),  # type: ignore[arg-type]
    ("checksum-missing", lambda s: s.files.record("a.txt", None, 1)),
    ("path-bytes", lambda s: s.files.record(b"a.txt", sha(b"x"), 1)),  # type: ignore[arg-type]
    ("path-int", lambda s: s.files.record(7, sha(b"x"), 1)),  # type: ignore[arg-type]
    ("path-none", lambda s: s.files.record(None, sha(b"x"), 1)),  # type: ignore[arg-type]
    ("path-empty", lambda s: s.files.record("", sha(b"x"), 1)),
    ("path-nul", lambda s: s.files.record("a\x00b", sha(b"x"), 1)),
    ("unknown-action", lambda s: s.files.record("a.txt", sha(b"x"), 1, action="renamed")),
    ("empty-task-id", lambda s: s.files.record("a.txt", sha(b"x"), 1, task_id="")),
    ("list-empty-session", lambda s: s.files.list(session_key="")),
]


@pytest.mark.parametrize("call", [c for _, c in BAD_RECORDS], ids=[n for n, _ in BAD_RECORDS])
async def test_bad_file_input_is_a_typed_error_and_writes_nothing(store: Store, call: BadRecord) -> None:
    kept = await store.files.record("kept.txt", sha(b"k"), 1)
    with pytest.raises(statekeel.InvalidArgument):
        await call(store)
    assert await store.files.list() == [kept] and await ledger_rows(store) == 1
    assert (await store.files.record("after.txt", sha(b"a"), 1)).seq == 1  # still usable


async def test_check_reports_changed_and_missing_files(store: Store, tmp_path: Path) -> None:
    same = write(tmp_path, "same.txt", b"unchanged")
    edited = write(tmp_path, "src/edited.py", b"print(1)\n")
    gone = write(tmp_path, "gone.txt", b"bye")
    for rel, (digest, size) in (("same.txt", same), ("src/edited.py", edited), ("gone.txt", gone)):
        await store.files.record(rel, digest, size, task_id="t1")
    await store.files.record("removed.txt", None, None, action="deleted")
    write(tmp_path, "back.txt", b"old")
    await store.files.record("back.txt", None, None, action="deleted")

    (tmp_path / "src/edited.py").write_bytes(b"print(2)\n")  # same size, other content
    (tmp_path / "gone.txt").unlink()
    drifts = await store.files.check(tmp_path)
    assert [(d.path, d.kind) for d in drifts] == [
        ("back.txt", "changed"),
        ("gone.txt", "missing"),
        ("src/edited.py", "changed"),
    ]
    edited_drift = drifts[2]
    assert (edited_drift.checksum, edited_drift.size) == (sha(b"print(2)\n"), 9)
    assert edited_drift.record.checksum == edited[0]
    assert (drifts[1].checksum, drifts[1].size) == (None, None)


async def test_check_compares_with_the_last_record_of_each_path(store: Store, tmp_path: Path) -> None:
    await store.files.record("a.txt", sha(b"first"), 5)
    digest, size = write(tmp_path, "a.txt", b"second")
    await store.files.record("a.txt", digest, size)
    assert await store.files.check(tmp_path) == []
    assert [r.checksum for r in await store.files.list(path="a.txt")] == [sha(b"first"), digest]


async def test_check_can_be_limited_to_what_a_task_or_session_touched(store: Store, tmp_path: Path) -> None:
    for rel, task, session in (("a.txt", "t1", "s1"), ("b.txt", "t2", "s1"), ("c.txt", "t2", "s2")):
        await store.files.record(rel, sha(b"x"), 1, task_id=task, session_key=session)
    assert [d.path for d in await store.files.check(tmp_path, task_id="t2")] == ["b.txt", "c.txt"]
    assert [d.path for d in await store.files.check(tmp_path, session_key="s1")] == ["a.txt", "b.txt"]
    assert [d.path for d in await store.files.check(tmp_path)] == ["a.txt", "b.txt", "c.txt"]


async def test_check_pages_through_a_large_ledger(store: Store, tmp_path: Path) -> None:
    async with store.backend.atomic():
        for i in range(1203):
            await store.files.record(f"f{i:05d}.txt", sha(b""), 0)
    for i in range(0, 1203, 2):
        (tmp_path / f"f{i:05d}.txt").write_bytes(b"")
    drifts = await store.files.check(tmp_path)
    assert [d.path for d in drifts] == [f"f{i:05d}.txt" for i in range(1, 1203, 2)]
    assert {d.kind for d in drifts} == {"missing"}


async def test_check_hashes_files_off_the_event_loop(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest, size = write(tmp_path, "big.bin", b"\x01" * (3 << 20))
    await store.files.record("big.bin", digest, size)
    threads: list[threading.Thread] = []
    real = statekeel.files._hash

    def spy(path: str) -> tuple[str, int]:
        threads.append(threading.current_thread())
        return real(path)

    monkeypatch.setattr(statekeel.files, "_hash", spy)
    assert await store.files.check(tmp_path) == []
    assert threads and threading.main_thread() not in threads
    assert await statekeel.checksum_file(tmp_path / "big.bin") == (digest, size)


async def test_check_refuses_a_root_that_is_not_a_directory(store: Store, tmp_path: Path) -> None:
    with pytest.raises(statekeel.InvalidArgument, match="not a directory"):
        await store.files.check(tmp_path / "missing")
    with pytest.raises(statekeel.InvalidArgument):
        await store.files.check(b"/tmp")  # type: ignore[arg-type]


async def test_concurrent_records_of_one_path_get_dense_sequence_numbers(store: Store) -> None:
    records = await asyncio.gather(*(store.files.record("hot.txt", sha(bytes([i])), 1) for i in range(20)))
    assert sorted(r.seq for r in records) == list(range(1, 21))
    listed = await store.files.list(path="hot.txt")
    assert [r.seq for r in listed] == list(range(1, 21))
    assert {r.checksum for r in listed} == {sha(bytes([i])) for i in range(20)}


async def test_the_ledger_survives_a_restart(store_url: str, tmp_path: Path) -> None:
    if store_url == "memory://":
        pytest.skip("an in-memory store cannot be opened again")
    digest, size = write(tmp_path, "work/fix.py", b"fixed")
    async with statekeel.open_store(store_url) as store:
        await store.files.record("work/fix.py", digest, size, task_id="fix-test")
    (tmp_path / "work/fix.py").write_bytes(b"broken again")
    async with statekeel.open_store(store_url) as store:
        assert [r.path for r in await store.files.list("fix-test")] == ["work/fix.py"]
        report = await store.recover(files_root=tmp_path)
        assert [(d.path, d.kind) for d in report.drifted_files] == [("work/fix.py", "changed")]
        assert report.summary()["drifted_files"] == 1
        assert (await store.recover()).drifted_files == []


def test_normalize_path_is_lexical_and_posix() -> None:
    normalize = statekeel.files.normalize_path
    assert normalize("a/b/../c") == "a/c"
    assert normalize("/srv/repo/x/y.txt", "/srv/repo/") == "x/y.txt"
    with pytest.raises(statekeel.InvalidArgument, match="root directory itself"):
        normalize("/srv/repo", "/srv/repo")


async def test_latest_pages_through_the_last_record_of_each_path_in_path_order(store: Store) -> None:
    for rel in ("b.txt", "a.txt", "c/d.txt"):
        await store.files.record(rel, sha(b"1"), 1, action="created", task_id="t1")
    newest = await store.files.record("a.txt", sha(b"22"), 2, session_key="s1")
    first = await store.files.latest(limit=2)
    assert [(r.path, r.seq) for r in first] == [("a.txt", 2), ("b.txt", 1)] and first[0] == newest
    rest = await store.files.latest(after_path=first[-1].path, limit=2)
    assert [r.path for r in rest] == ["c/d.txt"]
    assert [r.path for r in await store.files.latest(session_key="s1")] == ["a.txt"]
    with pytest.raises(statekeel.InvalidArgument):
        await store.files.latest(limit=0)


async def test_compare_tells_which_given_records_drifted_from_the_files_under_a_root(
    store: Store, tmp_path: Path
) -> None:
    kept = await store.files.record("kept.txt", *write(tmp_path, "kept.txt", b"same"))
    edited = await store.files.record("edited.txt", *write(tmp_path, "edited.txt", b"before"))
    removed = await store.files.record("removed.txt", *write(tmp_path, "removed.txt", b"x"))
    write(tmp_path, "edited.txt", b"after!")
    (tmp_path / "removed.txt").unlink()
    drifts = await store.files.compare(tmp_path, [kept, edited, removed])
    assert [(d.path, d.kind) for d in drifts] == [("edited.txt", "changed"), ("removed.txt", "missing")]
    assert drifts[0].checksum == sha(b"after!") and drifts[0].size == 6
    assert await store.files.compare(tmp_path, [kept]) == []
    with pytest.raises(statekeel.InvalidArgument, match="not a directory"):
        await store.files.compare(tmp_path / "nowhere", [kept])
