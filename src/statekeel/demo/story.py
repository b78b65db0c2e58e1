"""The story demo's parent side: hand a job to the agent process, SIGKILL it at one of its crash points,
start it again, and check what it did.

    result = await run_story("sqlite:////tmp/d/state.db", Path("/tmp/d"), crash_at=5)
    assert result.ok

The demo stands in for the person around the agent: it creates the job (a workflow of one task), grants
the approval the agent asks for, and keeps every acknowledgement the agent printed. After the restarted
agent finished, the checks read the world (the side-effect counter, the project's files, a fresh run of its
tests) and the store (the transcript, each acknowledged write, the audit chain, the file ledger).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import StatekeelError
from ..store import Store, open_store
from ..transcripts import analyze
from ..wording import counted
from . import workspace as ws
from .story_agent import CRASH_POINTS, STEP_TESTS, message_digest, names

AGENT_TIMEOUT_S = 60.0
DECIDED_BY = "demo (standing in for a person)"

Listener = Callable[[int, dict[str, Any]], None]


class StoryFailed(StatekeelError):
    """The story demo could not run (the agent failed on its own, or hung)."""

    hint = "See the agent's error output above; the store itself may be fine."


@dataclass(slots=True)
class AgentRun:
    """One run of the agent process."""

    pid: int
    killed_at: int | None = None
    killed_label: str | None = None
    returncode: int | None = None
    recovery: dict[str, Any] | None = None
    resolved: list[dict[str, Any]] = field(default_factory=list)
    stderr: str = ""


@dataclass(frozen=True, slots=True)
class Check:
    """One verdict of the demo: ``ok``, with what was found."""

    name: str
    ok: bool
    detail: str


@dataclass(slots=True)
class StoryResult:
    crash_at: int
    runs: list[AgentRun]
    checks: list[Check]
    effects: dict[str, int]
    acknowledged: dict[str, int]
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


@dataclass(slots=True)
class Acks:
    """Every write the agent (or the demo) saw acknowledged, by kind."""

    items: list[dict[str, Any]] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return dict(Counter(a["ack"] for a in self.items))


async def _agent(
    store: Store,
    url: str,
    root: Path,
    run_id: str,
    workflow_id: str,
    *,
    index: int,
    kill_at: int | None,
    acks: Acks,
    listen: Listener,
) -> AgentRun:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "statekeel.demo.story_agent",
        url,
        str(root),
        run_id,
        workflow_id,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    run = AgentRun(pid=proc.pid)
    listen(index, {"started": proc.pid})
    errors = asyncio.create_task(proc.stderr.read())

    async def answer(word: str) -> None:
        assert proc.stdin is not None
        with contextlib.suppress(ConnectionError):  # the agent died: its exit code tells
            proc.stdin.write(word.encode() + b"\n")
            await proc.stdin.drain()

    async def converse() -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            event = json.loads(line)
            if "ack" in event:
                acks.items.append(event)
            elif "recovery" in event:
                run.recovery = event["recovery"]
            elif "resolved" in event:
                run.resolved.append(event)
            if "point" in event and event["point"] == kill_at:
                proc.send_signal(signal.SIGKILL)
                run.killed_at = kill_at
                run.killed_label = event["label"]
                listen(index, {"killed": kill_at, "label": event["label"]})
                return
            listen(index, event)
            if "point" in event:
                await answer("go")
            elif "approval" in event:
                granted = await store.approvals.decide(
                    event["approval"], True, DECIDED_BY, "the demo grants it"
                )
                acks.items.append({"ack": "approval", "id": granted.id, "status": granted.status})
                await answer("decided")

    ended = False
    try:
        await asyncio.wait_for(converse(), AGENT_TIMEOUT_S)
        ended = True
    except TimeoutError:
        raise StoryFailed(
            f"the agent (pid {proc.pid}) did not finish within {AGENT_TIMEOUT_S:.0f} s"
        ) from None
    finally:
        if not ended and proc.returncode is None:
            proc.kill()  # timed out, or the demo was interrupted: never leave an agent behind
        try:
            # Its output ended (it exited, or was just killed): only its exit status is left to read.
            run.returncode = await asyncio.wait_for(proc.wait(), AGENT_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            run.returncode = await proc.wait()
        run.stderr = (await errors).decode("utf-8", "replace")
    if run.killed_at is None and run.returncode != 0:
        tail = "\n".join(run.stderr.strip().splitlines()[-15:])
        raise StoryFailed(f"the agent (pid {run.pid}) exited with code {run.returncode}:\n{tail}")
    return run


async def run_story(
    url: str,
    root: Path,
    *,
    crash_at: int,
    listen: Listener | None = None,
) -> StoryResult:
    """Create the job, run the agent until it is killed at crash point ``crash_at`` (1-based), run it again
    to the end, and check the outcome. ``root`` is the project made by :func:`workspace.create`."""
    if not 1 <= crash_at <= len(CRASH_POINTS):
        raise ValueError(f"crash_at must be in 1..{len(CRASH_POINTS)}, got {crash_at}")
    started = time.perf_counter()
    listen = listen or (lambda index, event: None)
    run_id = secrets.token_hex(4)
    acks = Acks()
    async with open_store(url) as store:
        workflow = await store.workflows.create(
            "demo: fix the calc project",
            [{"name": "fix", "title": "make the calc tests pass, then release", "max_retries": 0}],
            metadata={"run_id": run_id},
        )
        workflow = await store.workflows.start(workflow.id)
        killed = await _agent(
            store, url, root, run_id, workflow.id, index=1, kill_at=crash_at, acks=acks, listen=listen
        )
        expected = CRASH_POINTS[crash_at - 1].label
        if killed.killed_at is None:
            raise StoryFailed(f"the agent finished without reaching crash point {crash_at}")
        if killed.killed_label != expected:
            # The table of crash points and the agent's run disagree: every check would be judged
            # against the wrong moment.
            raise StoryFailed(
                f"crash point {crash_at} should be {expected!r}, but the agent was there: "
                f"{killed.killed_label!r}"
            )
        resumed = await _agent(
            store, url, root, run_id, workflow.id, index=2, kill_at=None, acks=acks, listen=listen
        )
        checks, effects = await verify_story(store, root, run_id, workflow.id, crash_at, acks, resumed)
    result = StoryResult(crash_at, [killed, resumed], checks, effects, acks.counts())
    result.elapsed_s = time.perf_counter() - started
    return result


async def verify_story(
    store: Store,
    root: Path,
    run_id: str,
    workflow_id: str,
    crash_at: int,
    acks: Acks,
    resumed: AgentRun,
) -> tuple[list[Check], dict[str, int]]:
    """The demo's verdicts, read from the world and from the store after the agent finished."""
    keys = names(run_id)
    workflow = await store.workflows.get(workflow_id)
    assert workflow is not None
    task = workflow.steps[0].task
    effects = ws.read_effects(root)
    checks = [
        _effects_check(effects),
        await _in_doubt_check(store, keys, task.id, crash_at, resumed),
        await _transcript_check(store, keys["session"]),
        await _acks_check(store, acks),
        await _world_check(store, root, task.id, workflow.status),
        await _audit_check(store),
    ]
    return checks, dict(effects)


def _effects_check(effects: Counter[str]) -> Check:
    once = {e: effects[e] for e in ws.NON_IDEMPOTENT}
    again = {e: effects[e] for e in ws.IDEMPOTENT}
    ok = all(n == 1 for n in once.values()) and all(n >= 1 for n in again.values())
    detail = (
        ", ".join(f"{e} {n}x" for e, n in once.items())
        + "; idempotent: "
        + ", ".join(f"{e} {n}x" for e, n in again.items())
    )
    return Check("effects_exactly_once", ok, detail)


async def _in_doubt_check(
    store: Store, keys: dict[str, str], task_id: str, crash_at: int, resumed: AgentRun
) -> Check:
    problems: list[str] = []
    expected = CRASH_POINTS[crash_at - 1].in_doubt
    found = resumed.recovery or {}
    surfaced = list(found.get("steps_in_doubt", []))
    resolved = {r["resolved"]: r["outcome"] for r in resumed.resolved}
    if expected is not None and expected not in surfaced:
        problems.append(f"recover() did not report step {expected!r} in doubt")
    for step in surfaced:
        if step not in resolved and step != STEP_TESTS:
            problems.append(f"step {step!r} was in doubt and never resolved")
    report = await store.recover(repair=False)
    left = [s.step_key for s in report.steps_in_doubt if s.task_id == task_id]
    left += [s.call_id for s in report.tool_calls_in_doubt if s.session_key == keys["session"]]
    left += [a.id for a in report.pending_approvals if a.subject == keys["subject"]]
    left += report.orphaned_tool_calls.get(keys["session"], [])
    if left:
        problems.append(f"still waiting for a decision after the run: {', '.join(left)}")
    steps = await store.tasks.steps(task_id)
    unsettled = [s.step_key for s in steps if s.status != "succeeded"]
    if unsettled:
        problems.append(f"steps not succeeded: {', '.join(unsettled)}")
    if problems:
        return Check("in_doubt_resolved", False, "; ".join(problems))
    if not surfaced:
        detail = f"nothing was in doubt; {_all(len(steps), 'step')} succeeded"
    else:
        how = [
            f"{s} ({resolved[s]} after checking)" if s in resolved else f"{s} (idempotent: ran again)"
            for s in surfaced
        ]
        detail = f"surfaced by recover() and resolved: {', '.join(how)}; {_all(len(steps), 'step')} succeeded"
    return Check("in_doubt_resolved", True, detail)


async def _transcript_check(store: Store, key: str) -> Check:
    session = await store.sessions.load(key)
    if session is None:
        return Check("transcript_valid", False, f"session {key!r} is missing")
    state = analyze(session.messages)
    window = analyze(session.history())
    problems: list[str] = []
    if not state.consistent:
        problems.append(
            f"{counted(len(state.unanswered), 'call')} without a result, "
            f"{counted(len(state.orphans), 'result')} without a call, {len(state.malformed)} malformed"
        )
    if not window.consistent:
        problems.append("history() would hand the model an unanswered call")
    if session.pending_calls():
        waiting = len(session.pending_calls())
        problems.append(f"{counted(waiting, 'call')} still wait{'s' if waiting == 1 else ''} for a result")
    last = session.messages[-1] if session.messages else {}
    if last.get("role") != "assistant" or last.get("tool_calls"):
        problems.append("the transcript does not end with the model's answer")
    if problems:
        return Check("transcript_valid", False, "; ".join(problems))
    interrupted = sum(
        1 for m in session.messages if m.get("role") == "tool" and "interrupted" in str(m.get("content"))
    )
    extra = f", {interrupted} answered 'interrupted' and asked again" if interrupted else ""
    return Check(
        "transcript_valid",
        True,
        f"{counted(len(state.calls), 'tool call')}, {counted(len(state.results), 'result')}, each call "
        f"exactly one{extra}",
    )


async def _acks_check(store: Store, acks: Acks) -> Check:
    lost: list[str] = []
    sessions: dict[str, Any] = {}
    traces: dict[str, set[str]] = {}
    for ack in acks.items:
        kind = ack["ack"]
        if kind == "message":
            if ack["key"] not in sessions:
                sessions[ack["key"]] = await store.sessions.load(ack["key"])
            session = sessions[ack["key"]]
            first = 0 if session is None else session.head_seq - len(session.messages)
            if session is None or not first <= ack["seq"] < session.head_seq:
                lost.append(f"message {ack['seq']}")
            elif message_digest(session.messages[ack["seq"] - first]) != ack["sha256"]:
                lost.append(f"message {ack['seq']} (changed)")
        elif kind == "step":
            if await store.tasks.get_step(ack["task_id"], ack["step_key"]) is None:
                lost.append(f"step {ack['step_key']!r}")
        elif kind == "file":
            records = await store.files.list(path=ack["path"])
            if not any(r.checksum == ack["sha256"] for r in records):
                lost.append(f"file record {ack['path']} {ack['sha256'][:12]}")
        elif kind == "memory":
            if await store.memory.get(ack["id"]) is None:
                lost.append(f"memory {ack['key']}")
        elif kind == "approval":
            approval = await store.approvals.get(ack["id"])
            if approval is None:
                lost.append(f"approval {ack['id']}")
            elif ack["status"] == "consumed" and approval.consumed_at is None:
                lost.append(f"approval {ack['id']} consumption")
            elif ack["status"] == "granted" and approval.status != "granted":
                lost.append(f"approval {ack['id']} grant")
        elif kind == "span":
            if ack["trace"] not in traces:
                traces[ack["trace"]] = {s.span_id for s in await store.traces.get(ack["trace"])}
            if ack["span_id"] not in traces[ack["trace"]]:
                lost.append(f"span {ack['span_id']}")
        elif kind == "task":
            if await store.tasks.get(ack["task_id"]) is None:
                lost.append(f"task {ack['task_id']}")
        else:
            lost.append(f"unknown acknowledgement {kind!r}")
    counts = acks.counts()
    summary = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
    if lost:
        return Check("acknowledged_writes_survived", False, f"{len(lost)} lost: {', '.join(lost[:8])}")
    return Check("acknowledged_writes_survived", True, f"all {len(acks.items)} survived ({summary})")


async def _world_check(store: Store, root: Path, task_id: str, workflow_status: str) -> Check:
    problems: list[str] = []
    tests = await asyncio.to_thread(ws.run_tests, root)
    ran = next((line for line in tests.stderr.splitlines() if line.startswith("Ran ")), "no tests ran")
    summary = ran.split(" in ")[0]
    if tests.returncode != 0:
        problems.append(f"the test suite fails ({summary})")
    version = (root / "VERSION").read_text(encoding="utf-8").strip()
    if version != ws.NEXT_VERSION:
        problems.append(f"VERSION is {version}, not {ws.NEXT_VERSION}")
    drift = await store.files.check(root, task_id=task_id)
    if drift:
        problems.append("files differ from the ledger: " + ", ".join(f"{d.path} {d.kind}" for d in drift))
    task = await store.tasks.get(task_id)
    if task is None or task.status != "success" or workflow_status != "success":
        problems.append(
            f"the job is not done (task {task.status if task else 'missing'}, workflow {workflow_status})"
        )
    if problems:
        return Check("tests_pass", False, "; ".join(problems))
    return Check(
        "tests_pass",
        True,
        f"a fresh run passes ({summary}); VERSION {version}; files match the ledger; job done",
    )


async def _audit_check(store: Store) -> Check:
    verification = await store.audit.verify()
    if not verification.ok:
        return Check("audit_verified", False, f"the audit chain breaks at {verification.first_bad_seq}")
    return Check(
        "audit_verified", True, f"the hash chain of {counted(verification.count, 'audit entry')} verifies"
    )


def _all(n: int, noun: str) -> str:
    """``the 1 step``, ``all 3 steps``."""
    return f"{'the' if n == 1 else 'all'} {counted(n, noun)}"


__all__ = ["AgentRun", "Check", "StoryFailed", "StoryResult", "run_story", "verify_story"]
