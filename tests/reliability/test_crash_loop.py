"""The crash loop: an agent process doing a realistic mix of work — session turns with tool calls, task
claims with journaled steps, approvals requested, granted and used, audit entries, trace spans — is
SIGKILLed at a random instant, restarted on the same store, killed again, cycle after cycle.

After every kill the next agent recovers, and the test checks what users depend on: every write whose
call returned (the child printed an ``ack`` line after it) is there with its exact content; message
sequence numbers are dense; every task is in a legal state and a task acknowledged done is done; the
audit chain and the approvals bound to it verify; SQLite's integrity check is clean.

CI runs 50 cycles on SQLite (and a fifth as many on PostgreSQL); ``STATEKEEL_CRASH_CYCLES=500`` runs the
long one. A failure names its seed: ``STATEKEEL_CRASH_SEED=<seed>`` replays the same kill schedule.

The same file is the agent: ``python test_crash_loop.py child <url> <seed>``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import random
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

CYCLES = int(os.environ.get("STATEKEEL_CRASH_CYCLES", "50"))
AGENT = os.path.abspath(__file__)
SESSIONS = 4
TOOL_PAD = "t" * 300


def message_content(key: str, seq: int) -> str:
    return f"{key}#{seq}"


# --- the agent (child process) -----------------------------------------------------------------------


async def agent(url: str, seed: int) -> None:
    """Work until killed, printing one ``ack`` line per write whose call returned."""
    import statekeel

    rng = random.Random(seed)
    out = sys.stdout

    def ack(*fields: Any) -> None:
        out.write(" ".join(["ack", *map(str, fields)]) + "\n")
        out.flush()

    async with statekeel.open_store(url) as store:
        await store.recover()
        out.write("ready\n")
        out.flush()
        sessions = [await store.sessions.get_or_create(f"s{i}") for i in range(SESSIONS)]
        n = 0
        while True:
            n += 1
            op = rng.random()
            if op < 0.35:
                session = rng.choice(sessions)
                first = session.head_seq
                call_id = f"call-{seed}-{n}"
                session.add_message("user", message_content(session.key, first))
                session.add_message(
                    "assistant",
                    message_content(session.key, first + 1),
                    tool_calls=[{"id": call_id, "type": "function", "function": {"name": "ls"}}],
                )
                session.add_message("tool", message_content(session.key, first + 2), tool_call_id=call_id)
                await store.sessions.save(session)
                ack("turn", session.key, first, session.head_seq)
            elif op < 0.55:
                task = await store.tasks.create(f"task {seed}-{n}", status="queued")
                ack("task", task.id)
            elif op < 0.7:
                await _work_on_a_task(store, f"w{seed}", n, ack)
            elif op < 0.8:
                approval = await store.approvals.request("repo", "deploy", {"n": n, "seed": seed}, "agent")
                ack("requested", approval.id)
                await store.approvals.decide(approval.id, True, "alice")
                ack("granted", approval.id)
                if rng.random() < 0.5:
                    await store.approvals.consume(approval.id, "agent")
                    ack("consumed", approval.id)
            elif op < 0.92:
                entry = await store.audit.append("tool.call", "agent", "repo", {"seed": seed, "n": n})
                ack("audit", entry.seq, seed, n)
            else:
                store.traces.record(
                    f"trace-{seed}", {"span_id": f"span-{n}", "name": "ls", "kind": "tool", "status": "ok"}
                )
                await store.traces.flush()
                ack("span", f"trace-{seed}", f"span-{n}")


async def _work_on_a_task(store: Any, worker: str, n: int, ack: Any) -> None:
    import statekeel

    interrupted = (await store.tasks.list(status="interrupted", limit=1)).items
    if interrupted:  # a task a killed agent left behind: queue it again
        await store.tasks.transition(interrupted[0].id, "queued")
    claimed = await store.tasks.claim(worker, lease_seconds=1)
    if claimed is None:
        return
    ack("claimed", claimed.id)
    try:
        result = await store.tasks.step(
            claimed.id,
            "work",
            lambda: {"by": worker, "n": n, "pad": TOOL_PAD},
            lease_epoch=claimed.lease_epoch,
        )
    except statekeel.StepInDoubt:
        # An earlier agent died inside this step: we checked (here: by decree) and settle it.
        await store.tasks.resolve_step(
            claimed.id,
            "work",
            "succeeded",
            result={"by": "resolved", "n": n},
            lease_epoch=claimed.lease_epoch,
        )
        result = await store.tasks.step(claimed.id, "work", lambda: None, lease_epoch=claimed.lease_epoch)
    ack("step", claimed.id, json.dumps(result, sort_keys=True, separators=(",", ":")))
    await store.tasks.transition(
        claimed.id, "success", worker_id=worker, lease_epoch=claimed.lease_epoch, result=result
    )
    ack("done", claimed.id)


# --- what the agents promised, and the check after each kill --------------------------------------------


@dataclass
class Promises:
    messages: dict[str, int] = field(default_factory=dict)  # session -> acknowledged head
    tasks: set[str] = field(default_factory=set)
    steps: dict[str, Any] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    granted: set[str] = field(default_factory=set)
    consumed: set[str] = field(default_factory=set)
    audit: dict[int, dict[str, int]] = field(default_factory=dict)
    spans: dict[str, set[str]] = field(default_factory=dict)

    def take(self, line: str) -> None:
        # Fields never hold spaces (step results are compact JSON).
        kind, *rest = line.split(" ")[1:]
        if kind == "turn":
            key, head = rest[0], int(rest[2])
            self.messages[key] = max(self.messages.get(key, 0), head)
        elif kind == "task":
            self.tasks.add(rest[0])
        elif kind == "step":
            self.steps[rest[0]] = json.loads(rest[1])
        elif kind == "done":
            self.done.add(rest[0])
        elif kind == "granted":
            self.granted.add(rest[0])
        elif kind == "consumed":
            self.consumed.add(rest[0])
        elif kind == "audit":
            self.audit[int(rest[0])] = {"seed": int(rest[1]), "n": int(rest[2])}
        elif kind == "span":
            self.spans.setdefault(rest[0], set()).add(rest[1])


async def run_cycle(url: str, seed: int, kill_after: float | None) -> tuple[list[str], bool]:
    """Start the agent, kill it ``kill_after`` s after it is ready (None: as soon as it starts); return the
    complete lines it printed and whether it was killed (rather than dying on its own)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        AGENT,
        "child",
        url,
        str(seed),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []

    async def read() -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            if line.endswith(b"\n"):  # a kill can cut the last line short: it promised nothing
                lines.append(line.decode().rstrip("\n"))

    reader = asyncio.create_task(read())
    try:
        if kill_after is not None:
            while "ready" not in lines:
                if proc.returncode is not None or reader.done():
                    break
                await asyncio.sleep(0.005)
            await asyncio.sleep(kill_after)
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await reader
        err = await proc.stderr.read()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    killed = proc.returncode == -signal.SIGKILL
    assert killed, f"the agent died on its own ({proc.returncode}):\n{err.decode()[-3000:]}"
    return lines, killed


async def check(url: str, promised: Promises) -> None:
    import statekeel
    from statekeel.backends.base import TASK_STATUSES

    async with statekeel.open_store(url) as store:
        report = await store.recover()
        assert report.ok, report.summary()
        assert report.integrity_problems == []
        for key, head in promised.messages.items():
            session = await store.sessions.load(key)
            assert session is not None, f"session {key} is gone"
            rows = await store.backend.read_messages(key)
            assert [r.seq for r in rows] == list(range(len(rows))), f"{key}: seqs are not dense"
            assert len(rows) >= head, f"{key}: {head} messages acknowledged, {len(rows)} stored"
            for row in rows[:head]:
                assert row.payload["content"] == message_content(key, row.seq), f"{key}#{row.seq} differs"
        tasks = {t.id: t for t in (await store.tasks.list(limit=100_000)).items}
        assert promised.tasks <= set(tasks), "an acknowledged task is missing"
        for task in tasks.values():
            assert task.status in TASK_STATUSES
            if task.status == "running":
                assert task.lease_expires_at is not None and task.lease_owner is not None
        for task_id in promised.done:
            assert tasks[task_id].status == "success", f"task {task_id} was acknowledged done"
        # Steps and approvals read in bulk (whole tables in key order): the check stays cheap as they grow.
        steps = {(r["task_id"], r["step_key"]): r for r in await _rows(store, "task_steps")}
        for task_id, result in promised.steps.items():
            step = steps.get((task_id, "work"))
            assert step is not None and step["status"] == "succeeded", f"step of {task_id} is not recorded"
            assert json.loads(step["result"]) == result
        approvals = {r["id"]: r for r in await _rows(store, "approvals")}
        for approval_id in promised.granted:
            assert approvals[approval_id]["status"] == "granted"
        for approval_id in promised.consumed:
            assert approvals[approval_id]["consumed_at"] is not None
        verification = await store.audit.verify()
        assert verification.ok, verification.reason
        entries = {e.seq: e.data for e in await store.audit.query(kind="tool.call", limit=100_000)}
        for seq, data in promised.audit.items():
            assert entries.get(seq) == data, f"audit entry {seq} differs"
        for trace_id, span_ids in promised.spans.items():
            stored = {s.span_id for s in await store.traces.get(trace_id)}
            assert span_ids <= stored, f"spans of {trace_id} are missing"
        if store.backend.url.startswith("sqlite"):
            assert await store.backend.integrity_check() == []


async def _rows(store: Any, table: str) -> list[dict[str, Any]]:
    """Every row of ``table`` as stored (the verbatim rows ``copy_store`` moves), as dicts."""
    from statekeel.backends.sql.copy import table_spec

    names = [name for name, _ in table_spec(table).columns]
    rows: list[dict[str, Any]] = []
    after = None
    while True:
        page = await store.backend.export_rows(table, after=after, limit=5000)
        rows.extend(dict(zip(names, row, strict=True)) for row in page.rows)
        if len(page.rows) < 5000:
            return rows
        after = page.last_key


async def crash_loop(url: str, cycles: int) -> Promises:
    seed = int(os.environ.get("STATEKEEL_CRASH_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
    rng = random.Random(seed)
    promised = Promises()
    started = dt.datetime.now(dt.UTC)
    for cycle in range(cycles):
        # A few kills land while the agent opens, migrates and recovers; most while it works.
        kill_after = None if rng.random() < 0.1 else rng.uniform(0.0, 0.4)
        lines, _ = await run_cycle(url, seed * 1000 + cycle, kill_after)
        for line in lines:
            if line.startswith("ack "):
                promised.take(line)
        try:
            await check(url, promised)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, cycle {cycle} ({url}): {exc}") from exc
    took = (dt.datetime.now(dt.UTC) - started).total_seconds()
    print(
        f"crash loop: {cycles} kills in {took:.1f} s (seed {seed}); acknowledged: "
        f"{sum(promised.messages.values())} messages, {len(promised.tasks)} tasks, "
        f"{len(promised.done)} done, "
        f"{len(promised.granted)} approvals, {len(promised.audit)} audit entries, "
        f"{sum(len(s) for s in promised.spans.values())} spans"
    )
    return promised


if __name__ == "__main__" and sys.argv[1:2] == ["child"]:
    asyncio.run(agent(sys.argv[2], int(sys.argv[3])))
    raise SystemExit(0)


# --- the tests ----------------------------------------------------------------------------------------

import pytest  # noqa: E402  (the child above needs only the standard library and statekeel)

from helpers import sqlite_url  # noqa: E402

# The long run (STATEKEEL_CRASH_CYCLES=500) takes longer than the default per-test timeout: a few seconds
# a cycle on a loaded machine.
LOOP_TIMEOUT = max(300, CYCLES * 6)


@pytest.mark.slow
@pytest.mark.timeout(LOOP_TIMEOUT)
async def test_every_acknowledged_write_survives_repeated_kills_on_sqlite(tmp_path: Any) -> None:
    promised = await crash_loop(sqlite_url(tmp_path / "agent.db"), CYCLES)
    assert sum(promised.messages.values()) > 0 and promised.tasks and promised.audit
    assert promised.done, "no task was ever finished: the loop exercised too little"


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(LOOP_TIMEOUT)
async def test_every_acknowledged_write_survives_repeated_kills_on_postgres(pg_migrated: str) -> None:
    promised = await crash_loop(pg_migrated, max(2, CYCLES // 5))
    assert sum(promised.messages.values()) > 0 and promised.tasks
