"""Export, import and erase killed with SIGKILL midway: an export leaves no file at its path, an import
leaves the store as it was (and running it again completes it), an erasure leaves whole batches done and
running it again finishes it. The child stops at a hook between two batches; the test kills it there."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

import statekeel
from helpers import kill9_when

SUBJECT = "user:alice"


async def _source(url: str) -> None:
    async with statekeel.open_store(url) as store:
        for i in range(40):
            session = await store.sessions.get_or_create(f"s{i:02d}")
            if i < 3:
                session.metadata["subject"] = SUBJECT
            for t in range(5):
                session.add_message("user", f"s{i} turn {t}")
            await store.sessions.save(session)
        await store.memory.put("user", "name", "Alice", scope=SUBJECT)
        await store.audit.append("note", "tester", "case", {"n": 1})


# The child runs the call with a callback that, once it has seen one batch, writes the marker file and
# waits on an event nobody sets: the parent kills it there.
_HOOK = (
    "import asyncio, os, sys, threading, statekeel\n"
    "marker = sys.argv[3]\n"
    "def hold(*_):\n"
    "    open(marker, 'w').close()\n"
    "    threading.Event().wait()\n"
)


def _body(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[1:]


async def test_an_export_killed_midway_leaves_no_file_at_its_path(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'src.db'}"
    await _source(url)
    target, marker = tmp_path / "out" / "x.jsonl", tmp_path / "marker"
    target.parent.mkdir()
    script = _HOOK + (
        "async def main():\n"
        "    async with statekeel.open_store(sys.argv[1]) as store:\n"
        "        await statekeel.export_store(store, sys.argv[2], batch_size=10, on_batch=hold)\n"
        "asyncio.run(main())\n"
    )
    await asyncio.to_thread(
        kill9_when, [script, url, str(target), str(marker)], marker.exists, "the first batch"
    )
    assert not target.exists()
    leftovers = list(target.parent.iterdir())
    assert all(p.name.startswith(".x.jsonl.") and p.name.endswith(".partial") for p in leftovers)
    async with statekeel.open_store(url) as store:
        report = await statekeel.export_store(store, target)
    assert report.counts["messages"] == 200


async def test_an_import_killed_midway_leaves_the_store_unchanged_and_a_rerun_completes(
    tmp_path: Path, shared_url: str
) -> None:
    src, dst = f"sqlite:///{tmp_path / 'src.db'}", shared_url
    await _source(src)
    export, marker = tmp_path / "x.jsonl", tmp_path / "marker"
    async with statekeel.open_store(src) as store:
        exported = await statekeel.export_store(store, export)
    async with statekeel.open_store(dst) as store:
        mine = await store.sessions.get_or_create("already-here")
        mine.add_message("user", "kept")
        await store.sessions.save(mine)
    script = _HOOK + (
        "async def main():\n"
        "    async with statekeel.open_store(sys.argv[1]) as store:\n"
        "        await statekeel.import_store(store, sys.argv[2], batch_size=10, on_batch=hold)\n"
        "asyncio.run(main())\n"
    )
    await asyncio.to_thread(kill9_when, [script, dst, str(export), str(marker)], marker.exists, "a batch")
    async with statekeel.open_store(dst) as store:
        tables = await store.backend.copy_tables()
        counts = {t.name: await store.backend.count_rows(t.name) for t in tables}
        assert counts["sessions"] == 1 and counts["messages"] == 1 and counts["audit_log"] == 0
        report = await statekeel.import_store(store, export)
        assert report.counts == exported.counts
        assert (await store.audit.verify()).ok
        again = tmp_path / "y.jsonl"
        await statekeel.export_store(store, again, sessions=[f"s{i:02d}" for i in range(40)])
    async with statekeel.open_store(src) as store:
        await statekeel.export_store(store, tmp_path / "z.jsonl", sessions=[f"s{i:02d}" for i in range(40)])
    assert [orjson.loads(x) for x in _body(again) if x] == [
        orjson.loads(x) for x in _body(tmp_path / "z.jsonl") if x
    ]


async def test_an_erasure_killed_between_batches_is_finished_by_running_it_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'src.db'}"
    await _source(url)
    marker = tmp_path / "marker"
    script = _HOOK + (
        "async def main():\n"
        "    async with statekeel.open_store(sys.argv[1]) as store:\n"
        "        erase = store.backend.erase_sessions\n"
        "        async def first_then_hold(*args, **kwargs):\n"
        "            batch = await erase(*args, **kwargs)\n"
        "            hold()\n"
        "        store.backend.erase_sessions = first_then_hold\n"
        "        await store.erase(sys.argv[2], actor='dpo', reason='r', batch_size=1)\n"
        "asyncio.run(main())\n"
    )
    await asyncio.to_thread(kill9_when, [script, url, SUBJECT, str(marker)], marker.exists, "one batch")
    async with statekeel.open_store(url) as store:
        left = await store.backend.erasure_sessions(SUBJECT, after=None, limit=100)
        assert left == ["s01", "s02"]  # the first batch (s00) committed whole, the others untouched
        assert await store.sessions.load("s00") is None
        assert (await store.audit.query(kind="erasure")) == []
        report = await store.erase(SUBJECT, actor="dpo", reason="r")
        assert report.sessions == 2 and report.messages == 10 and report.memories == 1
        assert await store.backend.erasure_sessions(SUBJECT, after=None, limit=100) == []
        assert len(await store.audit.query(kind="erasure")) == 1
        assert (await store.audit.verify()).ok
        kept = await store.sessions.load("s10")
        assert kept is not None and len(kept.messages) == 5


async def test_an_erasure_killed_between_batches_leaves_no_fork_without_its_parent(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'forks.db'}"
    async with statekeel.open_store(url) as store:
        for key, meta in ((SUBJECT, {}), ("chat", {"subject": SUBJECT}), ("other", {})):
            session = await store.sessions.get_or_create(key)
            session.metadata.update(meta)
            for t in range(4):
                session.add_message("user", f"{key} turn {t}")
            await store.sessions.save(session)
        for parent, key in (("chat", "chat-f"), (SUBJECT, "f1"), ("f1", "f1-x"), ("other", "other-f")):
            fork = await store.sessions.fork(parent, 2, new_key=key)
            fork.add_message("user", f"{key} own")
            await store.sessions.save(fork)
    marker = tmp_path / "marker"
    script = _HOOK + (
        "async def main():\n"
        "    async with statekeel.open_store(sys.argv[1]) as store:\n"
        "        erase = store.backend.erase_sessions\n"
        "        async def first_then_hold(*args, **kwargs):\n"
        "            batch = await erase(*args, **kwargs)\n"
        "            hold()\n"
        "        store.backend.erase_sessions = first_then_hold\n"
        "        await store.erase(sys.argv[2], actor='dpo', reason='r', batch_size=1)\n"
        "asyncio.run(main())\n"
    )
    await asyncio.to_thread(kill9_when, [script, url, SUBJECT, str(marker)], marker.exists, "one batch")
    async with statekeel.open_store(url) as store:
        # The first batch (chat) took its fork with it, in its one transaction; the rest is untouched and
        # every session left loads whole.
        left = await store.backend.erasure_sessions(SUBJECT, after=None, limit=100)
        assert left == ["f1", "f1-x", SUBJECT]
        assert await store.sessions.load("chat") is None and await store.sessions.load("chat-f") is None
        for key in (*left, "other", "other-f"):
            session = await store.sessions.load(key)
            assert session is not None and len(session.messages) >= 3
        report = await store.erase(SUBJECT, actor="dpo", reason="r")
        assert report.sessions == 3 and report.messages == 4 + 1 + 1
        assert await store.backend.erasure_sessions(SUBJECT, after=None, limit=100) == []
        kept = await store.sessions.load("other-f")
        assert kept is not None and [m["content"] for m in kept.messages][-1] == "other-f own"
