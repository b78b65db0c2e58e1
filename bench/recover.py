"""What ``store.recover()`` costs on a large store: ``python bench/recover.py [--sizes 20000,50000,100000]``.

Each store holds ``size`` sessions of one turn (user, assistant tool call, tool result, answer) written as
the session manager writes them (no waiting calls), plus ``--open`` sessions whose last tool call was left
without a result by a process that is gone. Per size, on a fresh open of the SQLite file:

- ``repair``: the part of ``recover()`` that finds and repairs sessions with waiting tool calls (here:
  answers ``--open`` sessions), then ``again``: the same with nothing left to repair;
- ``recover``: the whole ``recover()`` with nothing left to repair; it also runs the other recovery checks,
  among them SQLite's ``integrity_check``, which reads the whole file (``integrity``: that check alone;
  ``rest``: ``recover()`` with the check left out);
- ``scan``: what finding those sessions cost before the count of waiting calls was kept on the session
  row: every active session listed and the tail of its messages read (the old ``recover()``);
- ``upgrade``: the first ``recover()`` after the migration that added the counts, which counts every
  session once from the tail of its messages (then ``again`` applies).

With ``--kinds`` (the sizes of ``--kinds-sizes``), the store also holds every other kind recovery looks
at, and ``recover(files_root=…)`` is timed as a whole: 10,000 tasks (5,000 claimed, stepped and finished,
100 left running under an expired lease with a step started: in doubt), about 30,000 audit entries (each
task change is audited), 50 pending approvals, 20 unfinished workflows, 10,000 memories with 100 open
contradictions, their vectors with 500 lagging, 50,000 spans (7 dropped), and 2,000 files of 1 KiB in the
file ledger (10 changed on disk since). Figures: ``first`` (interrupts the 100 tasks), ``again`` (nothing
left to repair), ``unchecked`` (the same with ``check_integrity=False``), and the parts: ``integrity``
(SQLite's check), ``audit`` (``audit.verify()``, which re-hashes every entry), ``files`` (``files.check``:
hashes every recorded file) and ``rest`` (``recover()`` with those three left out: everything found
through indexes).

Medians of ``--repeats`` runs. Prints a table and writes ``bench/results/recover-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import json
import logging
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import statekeel  # noqa: E402
from messages import turn  # noqa: E402
from statekeel.backends.base import NewMessage  # noqa: E402

BATCH = 2000
KIND_TASKS, KIND_DONE, KIND_LAPSED = 10_000, 5_000, 100
KIND_MEMORIES, KIND_CONTRADICTIONS, KIND_LAGGING = 10_000, 100, 500
KIND_SPANS, KIND_DROPPED, KIND_FILES, KIND_CHANGED = 50_000, 7, 2_000, 10


def tiny_embed(texts: list[str]) -> list[list[float]]:
    return [[len(t) + 1.0] + [float(t.count(c)) for c in "aeiouyt"] for t in texts]


async def add_kinds(path: str, root: str) -> None:
    """Every other kind of state recovery looks at (see the module docstring)."""
    from statekeel.backends.base import NewSpan

    async with statekeel.open_store(f"sqlite:///{path}") as store:
        tasks = store.tasks
        for start in range(0, KIND_TASKS, BATCH):
            async with store.backend.atomic():
                for i in range(start, min(KIND_TASKS, start + BATCH)):
                    await tasks.create(f"task {i}", status="queued")
        for i in range(KIND_DONE + KIND_LAPSED):
            task = await tasks.claim("worker", lease_seconds=1 if i >= KIND_DONE else 600)
            assert task is not None
            if i < KIND_DONE:
                await tasks.step(task.id, "work", lambda: "ok", lease_epoch=task.lease_epoch)
                await tasks.transition(task.id, "success", worker_id="worker", lease_epoch=task.lease_epoch)
            else:  # started, then the worker died: in doubt once its lease is over
                await store.backend.begin_step(
                    task.id, "work", rerun_started=False, lease_epoch=None, now=dt.datetime.now(dt.UTC)
                )
        for i in range(50):
            await store.approvals.request(f"repo-{i}", "deploy", {"env": "prod"}, requested_by="agent")
        for i in range(20):
            wf = await store.workflows.create(f"wf {i}", [{"name": "a"}, {"name": "b", "depends_on": ["a"]}])
            await store.workflows.start(wf.id)
        memories = []
        for start in range(0, KIND_MEMORIES, BATCH):
            async with store.backend.atomic():
                for i in range(start, min(KIND_MEMORIES, start + BATCH)):
                    memories.append(await store.memory.put("semantic", f"k{i}", f"fact {i} about the repo"))
        for i in range(KIND_CONTRADICTIONS):
            await store.memory.record_contradiction(memories[2 * i].id, memories[2 * i + 1].id, "differ")
        await store.vectors.rebuild(tiny_embed, model="tiny", batch_size=500)
        async with store.backend.atomic():
            for i in range(KIND_LAGGING):
                await store.memory.put("semantic", f"k{i}", f"fact {i} about the repo, revised")
        at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        for start in range(0, KIND_SPANS, BATCH):
            spans = [
                NewSpan(f"trace-{n // 10}", f"span-{n}", None, "tool", "tool", "ok", b"{}", at, at)
                for n in range(start, min(KIND_SPANS, start + BATCH))
            ]
            await store.backend.write_spans(spans, dropped=KIND_DROPPED if start == 0 else 0)
        block = os.urandom(1024)
        digest = hashlib.sha256(block).hexdigest()
        for i in range(KIND_FILES):
            with open(os.path.join(root, f"f{i:05d}.bin"), "wb") as fh:
                fh.write(block)
        async with store.backend.atomic():
            for i in range(KIND_FILES):
                await store.files.record(f"f{i:05d}.bin", digest, len(block))
        for i in range(KIND_CHANGED):
            with open(os.path.join(root, f"f{i:05d}.bin"), "ab") as fh:
                fh.write(b"edited")


async def build(path: str, sessions: int, waiting: int) -> None:
    """``sessions`` whole turns, counted as a save counts them, and ``waiting`` sessions left open."""
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        encoded = [NewMessage(m["role"], store.codec.encode(m)) for m in turn(0)]
        for start in range(0, sessions, BATCH):
            async with store.backend.atomic():
                for i in range(start, min(sessions, start + BATCH)):
                    await store.backend.append_messages(
                        f"session-{i:07d}", 0, encoded, create=True, open_calls=0
                    )
        gone = statekeel.SessionManager(store.backend, store.codec)
        for i in range(waiting):
            session = await gone.get_or_create(f"waiting-{i:03d}")
            for message in turn(i)[:2]:  # the user's question and the model's tool call
                session.add_item(message)
            await gone.save(session)
        await gone.close()  # its process is gone: its calls are answered by the next recover()


def scan(path: str) -> Callable[[Any], Awaitable[int]]:
    async def old_recover_scan(store: Any) -> int:
        n = 0
        async for record in store.sessions.iter(status="active", page_size=500):
            await store.backend.tail_messages(record.key, 200)
            n += 1
        return n

    return old_recover_scan


async def timed(path: str, fn: Callable[[Any], Awaitable[Any]]) -> tuple[float, Any]:
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        t0 = time.perf_counter()
        out = await fn(store)
        return time.perf_counter() - t0, out


async def repair_part(store: Any) -> Any:
    return await store.sessions.recover_tool_calls(True)


async def whole(store: Any) -> Any:
    return await store.recover()


async def integrity(store: Any) -> Any:
    return await store.backend.integrity_check()


async def without_integrity(store: Any) -> Any:
    async def skipped() -> list[str]:
        return []

    store.backend.integrity_check = skipped
    return await store.recover()


def forget_counts(path: str) -> None:
    """The state right after the migration that added the counts: unknown for every session."""
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE sessions SET open_calls = -1 WHERE head_seq > last_consolidated")
    conn.close()


def remove_db(path: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)


async def measure(size: int, waiting: int, repeats: int, scratch: str) -> dict[str, Any]:
    runs: dict[str, list[float]] = {
        "repair": [],
        "again": [],
        "recover": [],
        "integrity": [],
        "rest": [],
        "scan": [],
        "upgrade": [],
    }
    for _ in range(repeats):
        path = os.path.join(scratch, f"recover-{size}.db")
        remove_db(path)
        await build(path, size, waiting)
        seconds, found = await timed(path, repair_part)
        assert len(found.repaired) == waiting, f"repaired {len(found.repaired)} of {waiting}"
        runs["repair"].append(seconds)
        seconds, found = await timed(path, repair_part)
        assert not found.repaired
        runs["again"].append(seconds)
        seconds, report = await timed(path, whole)
        assert report.ok and not report.orphaned_tool_calls
        runs["recover"].append(seconds)
        seconds, problems = await timed(path, integrity)
        assert problems == []
        runs["integrity"].append(seconds)
        seconds, report = await timed(path, without_integrity)
        assert report.ok
        runs["rest"].append(seconds)
        seconds, n = await timed(path, scan(path))
        assert n == size + waiting
        runs["scan"].append(seconds)
        forget_counts(path)
        seconds, found = await timed(path, repair_part)
        assert not found.repaired
        runs["upgrade"].append(seconds)
        seconds, found = await timed(path, repair_part)
        assert not found.repaired and seconds < runs["upgrade"][-1]
    return {
        "size": size,
        "waiting": waiting,
        "runs": runs,
        "median": {k: statistics.median(v) for k, v in runs.items()},
    }


async def measure_kinds(size: int, repeats: int, scratch: str) -> dict[str, Any]:
    names = ("first", "again", "unchecked", "integrity", "audit", "files", "rest")
    runs: dict[str, list[float]] = {k: [] for k in names}
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    for _ in range(repeats):
        path = os.path.join(scratch, f"kinds-{size}.db")
        root = os.path.join(scratch, f"files-{size}")
        remove_db(path)
        os.makedirs(root, exist_ok=True)
        await build(path, size, 0)
        await add_kinds(path, root)

        async def first(store: Any, root: str = root) -> Any:
            return await store.recover(now=later, files_root=root)

        seconds, report = await timed(path, first)
        assert len(report.interrupted_tasks) == KIND_LAPSED, report.summary()
        assert len(report.steps_in_doubt) == KIND_LAPSED and len(report.pending_approvals) == 50
        assert len(report.unfinished_workflows) == 20
        assert len(report.open_contradictions) == KIND_CONTRADICTIONS
        assert len(report.drifted_files) == KIND_CHANGED and report.traces_dropped == KIND_DROPPED
        assert report.lagging_vectors == KIND_LAGGING and report.ok, report.summary()
        runs["first"].append(seconds)
        seconds, again = await timed(path, first)
        assert not again.interrupted_tasks and len(again.drifted_files) == KIND_CHANGED
        runs["again"].append(seconds)

        async def unchecked(store: Any, root: str = root) -> Any:
            return await store.recover(now=later, files_root=root, check_integrity=False)

        seconds, quick = await timed(path, unchecked)
        assert not quick.integrity_checked and len(quick.drifted_files) == KIND_CHANGED
        runs["unchecked"].append(seconds)
        seconds, problems = await timed(path, integrity)
        assert problems == []
        runs["integrity"].append(seconds)

        async def audit(store: Any) -> Any:
            return await store.audit.verify()

        seconds, verification = await timed(path, audit)
        assert verification.ok
        runs["audit"].append(seconds)

        async def files(store: Any, root: str = root) -> Any:
            return await store.files.check(root)

        seconds, drifts = await timed(path, files)
        assert len(drifts) == KIND_CHANGED
        runs["files"].append(seconds)

        async def rest(store: Any) -> Any:
            async def nothing() -> list[str]:
                return []

            async def verified() -> None:
                return None

            store.backend.integrity_check = nothing
            store.audit.verify = verified
            return await store.recover(now=later)

        seconds, report = await timed(path, rest)
        assert len(report.steps_in_doubt) == KIND_LAPSED
        runs["rest"].append(seconds)
        entries = verification.count
    return {
        "size": size,
        "audit_entries": entries,
        "runs": runs,
        "median": {k: statistics.median(v) for k, v in runs.items()},
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20000,50000,100000")
    parser.add_argument("--open", type=int, default=10, dest="waiting")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", action="store_true", help="only the store with every kind of state")
    parser.add_argument("--kinds-sizes", default="100000")
    args = parser.parse_args()
    logging.getLogger("statekeel").setLevel(logging.ERROR)  # the repairs are logged: expected here
    results = []
    with tempfile.TemporaryDirectory(prefix="statekeel-recover-") as scratch:
        for size in (int(s) for s in args.kinds_sizes.split(",")) if args.kinds else ():
            results.append(await measure_kinds(size, args.repeats, scratch))
            m = results[-1]["median"]
            print(
                f"{size:>7} sessions + every kind ({results[-1]['audit_entries']} audit entries): "
                + "  ".join(f"{k} {v * 1e3:8.1f} ms" for k, v in m.items()),
                flush=True,
            )
        for size in (int(s) for s in args.sizes.split(",")) if not args.kinds else ():
            results.append(await measure(size, args.waiting, args.repeats, scratch))
            m = results[-1]["median"]
            print(
                f"{size:>7} sessions: repair {m['repair'] * 1e3:8.1f} ms  again {m['again'] * 1e3:8.1f} ms  "
                f"recover {m['recover'] * 1e3:8.1f} ms  integrity {m['integrity'] * 1e3:8.1f} ms  "
                f"rest {m['rest'] * 1e3:8.1f} ms  "
                f"scan {m['scan'] * 1e3:8.1f} ms  "
                f"upgrade {m['upgrade'] * 1e3:8.1f} ms",
                flush=True,
            )
    out_dir = os.path.join(HERE, "results")
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    with open(os.path.join(out_dir, f"recover-{stamp}.json"), "w", encoding="utf-8") as fh:
        json.dump({"python": sys.version, "sqlite": sqlite3.sqlite_version, "results": results}, fh, indent=2)


if __name__ == "__main__":
    asyncio.run(main())
