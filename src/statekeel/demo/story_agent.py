"""The story demo's agent: a scripted, deterministic coding agent (no LLM, no network) run as its own
process, so that the demo can kill it with SIGKILL and start it again.

    python -m statekeel.demo.story_agent URL PROJECT_ROOT RUN_ID WORKFLOW_ID

It claims its job (the one task of workflow ``WORKFLOW_ID``), then loops as a real agent does: a stand-in
for the model (:func:`model`) reads the transcript and asks for the next tool; each tool call runs through
``sessions.run_tool``; the tools journal their side effects as task steps (``tasks.step``), record the files
they change (``store.files``), ask for an approval before the risky command (``store.approvals``), save what
was learned (``store.memory``) and trace every call (``store.traces``). Started again after a crash, it
interrupts the task its dead predecessor held, runs ``store.recover()``, and settles each step found in
doubt by looking at the world (did the file change? did the version move?) before going on.

It talks to the demo on stdout, one JSON object a line, flushed, and waits on stdin where it must:

- ``{"point": n, "label": ...}``: a moment the demo may kill it at; it goes on when it reads ``go``;
- ``{"approval": id, ...}``: it asked a person for an approval; it goes on when it reads ``decided``;
- ``{"ack": kind, ...}``: a write whose call returned, so the store promised to keep it;
- ``{"say": text}``, ``{"recovery": {...}}``, ``{"resolved": ...}``: what happened, for the story.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import StepInDoubt
from ..files import checksum_file
from ..holders import holder_is_dead, new_owner_id
from ..recovery import RecoveryReport
from ..sessions.session import Session
from ..store import Store, open_store
from ..tasks import Task
from ..transcripts import INTERRUPTED_TEXT, ToolCall
from . import workspace as ws

AGENT = "demo-agent"
REQUEST = f"The calc tests fail (see {ws.LOG_PATH}). Fix them, then release a patch."
STEP_EDIT = f"edit {ws.CALC_PATH}"
STEP_TESTS = "run the tests after the edit"
STEP_ASK = "ask for approval: release"
STEP_RELEASE = "release"
LEASE_SECONDS = 120  # far longer than the demo: a crash is noticed by the holder's death, not by expiry


class Point(NamedTuple):
    """A moment the demo may kill the agent at; ``in_doubt`` is the task step a kill there leaves started
    without an outcome, if any."""

    label: str
    in_doubt: str | None = None


# The moments of a first run, in the order it reaches them: ``--crash-at N`` kills it at the N-th.
USER_SAVED = Point("the job is claimed and the user's request saved")
CALL_SAVED = Point("the model asked to read the log; the call is saved, not run yet")
LOG_READ = Point("the log was read; its result is not in the transcript yet")
EDIT_STARTED = Point(
    f"the edit of {ws.CALC_PATH} is journaled as started; the file is not changed yet", STEP_EDIT
)
EDIT_DONE = Point(f"{ws.CALC_PATH} is changed; the step's result is not recorded", STEP_EDIT)
EDIT_RECORDED = Point("the edit is recorded, the lesson saved; the tool result is not in the transcript")
TESTS_RAN = Point("the tests ran; the step's result is not recorded", STEP_TESTS)
ASKED = Point("the approval request is stored; the step's result is not recorded", STEP_ASK)
PENDING = Point("the approval is asked for; nobody has decided yet")
GRANTED = Point("the approval is granted; the command has not run")
RELEASED = Point("the release command ran; the step's result is not recorded", STEP_RELEASE)
RELEASE_RECORDED = Point("the release is recorded; the model has not answered yet")
ANSWERED = Point("the final answer is saved; the task is not marked done")
CRASH_POINTS = (
    USER_SAVED,
    CALL_SAVED,
    LOG_READ,
    EDIT_STARTED,
    EDIT_DONE,
    EDIT_RECORDED,
    TESTS_RAN,
    ASKED,
    PENDING,
    GRANTED,
    RELEASED,
    RELEASE_RECORDED,
    ANSWERED,
)


def message_digest(message: Any) -> str:
    """The SHA-256 of a message's canonical JSON: what an acknowledgement of it promises."""
    return hashlib.sha256(json.dumps(message, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def names(run_id: str) -> dict[str, str]:
    """The keys this run's state lives under, so that runs on one store never mix."""
    base = f"demo-story-{run_id}"
    return {"session": base, "trace": base, "subject": f"{base}:calc", "scope": base}


def _call(call_id: str, name: str, args: dict[str, Any], text: str | None) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        ],
    }


def model(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The stand-in for the LLM: the next assistant message, a pure function of the transcript."""
    calls: dict[str, dict[str, Any]] = {}
    last: tuple[dict[str, Any], str] | None = None
    for message in history:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or ():
                calls[call["id"]] = call
        elif message.get("role") == "tool":
            last = (calls[message["tool_call_id"]], str(message.get("content")))
    if last is None:
        return _call("call_read_log", "read_log", {"path": ws.LOG_PATH}, None)
    call, output = last
    name = call["function"]["name"]
    args = json.loads(call["function"]["arguments"])
    if output == INTERRUPTED_TEXT:
        return _call(call["id"] + "-again", name, args, "That call was interrupted; asking again.")
    if name == "read_log":
        failure = next((line for line in output.splitlines() if "Error" in line), "a failure")
        return _call(
            "call_edit",
            "edit_file",
            {"path": ws.CALC_PATH, "old": ws.BUGGY_LINE.strip(), "new": ws.FIXED_LINE.strip()},
            f"add() subtracts ({failure.strip()}). Fixing it.",
        )
    if name == "edit_file":
        return _call("call_tests", "run_tests", {"argv": list(ws.TEST_ARGV)}, None)
    if name == "run_tests" and output.startswith("exit code 0"):
        return _call(
            "call_release", "shell", {"argv": list(ws.RELEASE_ARGV)}, "The tests pass. Releasing a patch."
        )
    if name == "run_tests":
        return {"role": "assistant", "content": f"The tests still fail:\n{output}"}
    return {
        "role": "assistant",
        "content": f"Fixed add() (it subtracted), the tests pass, and {output.strip()}.",
    }


class Agent:
    """One run of the agent process."""

    def __init__(self, store: Store, root: Path, run_id: str, workflow_id: str) -> None:
        self.store = store
        self.root = root
        self.names = names(run_id)
        self.workflow_id = workflow_id
        self.worker = new_owner_id()
        self.points = 0
        self.acked_seq = 0
        self.task: Task | None = None
        self.unacked_spans: list[str] = []
        self.span_starts: dict[str, dt.datetime] = {}

    # --- talking to the demo ----------------------------------------------------------------------------

    @staticmethod
    def send(**obj: Any) -> None:
        sys.stdout.write(json.dumps(obj, default=str) + "\n")
        sys.stdout.flush()

    def say(self, text: str, tag: str = "ok") -> None:
        self.send(say=text, tag=tag)

    async def _wait_for(self, word: str) -> None:
        line = await asyncio.to_thread(sys.stdin.readline)
        if line.strip() != word:
            raise SystemExit(f"story agent: expected {word!r} from the demo, got {line.strip()!r}")

    async def point(self, point: Point) -> None:
        """A moment the demo may kill this process at (it answers ``go`` to go on)."""
        await self.flush_spans()
        self.points += 1
        self.send(point=self.points, label=point.label)
        await self._wait_for("go")

    # --- acknowledgements: writes whose call returned -----------------------------------------------------

    def ack_messages(self, session: Session) -> None:
        first = session.head_seq - len(session.messages)
        for seq in range(max(self.acked_seq, first), session.saved_head):
            self.send(
                ack="message", key=session.key, seq=seq, sha256=message_digest(session.messages[seq - first])
            )
        self.acked_seq = max(self.acked_seq, session.saved_head)

    def span(self, span_id: str, name: str, kind: str, *, end: bool = False, **attributes: Any) -> None:
        """Record a span of this run's trace (buffered tier: acknowledged once a flush returned)."""
        now = dt.datetime.now(dt.UTC)
        started = self.span_starts.setdefault(span_id, now)
        parent = None if kind == "agent" else self.root_span
        self.store.traces.record(
            self.names["trace"],
            {
                "span_id": span_id,
                "parent_span_id": parent,
                "name": name,
                "kind": kind,
                "status": "ok" if end else "unset",
                "attributes": attributes,
                "started_at": started,
                "ended_at": now if end else None,
            },
        )
        self.unacked_spans.append(span_id)

    async def flush_spans(self) -> None:
        await self.store.traces.flush()
        for span_id in dict.fromkeys(self.unacked_spans):
            self.send(ack="span", trace=self.names["trace"], span_id=span_id)
        self.unacked_spans.clear()

    @property
    def root_span(self) -> str:
        return f"agent-{self.worker.split('|')[2]}"

    @property
    def task_id(self) -> str:
        assert self.task is not None
        return self.task.id

    @property
    def lease_epoch(self) -> int:
        assert self.task is not None
        return self.task.lease_epoch

    # --- the job -----------------------------------------------------------------------------------------

    async def claim(self) -> bool:
        """Take the job's task (after a crash: back from the dead process that held it). False when done."""
        tasks = self.store.tasks
        workflow = await self.store.workflows.get(self.workflow_id)
        if workflow is None or len(workflow.steps) != 1:
            raise SystemExit(f"story agent: workflow {self.workflow_id!r} is not the demo's job")
        task = workflow.steps[0].task
        if task.status == "running" and holder_is_dead(task.lease_owner):
            pid = (task.lease_owner or "").split("|")[2]
            task = await tasks.transition(task.id, "interrupted")
            self.say(f"the task was running in pid {pid}, which is gone: interrupted", "recover")
        report = await self.store.recover()
        self.send(recovery=self.describe(report, task.id))
        task = await tasks.get(task.id) or task
        if task.status == "success":
            self.say("the job is already done")
            return False
        if task.status == "interrupted":
            task = await tasks.transition(task.id, "queued")
        claimed = await tasks.claim(self.worker, lease_seconds=LEASE_SECONDS, workflow_id=self.workflow_id)
        if claimed is None or claimed.id != task.id:
            raise SystemExit(f"story agent: could not claim task {task.id} (it is {task.status})")
        self.task = claimed
        self.send(ack="task", task_id=claimed.id, status=claimed.status)
        self.say(f"claimed the task {claimed.title!r} (lease epoch {claimed.lease_epoch})")
        return True

    def describe(self, report: RecoveryReport, task_id: str) -> dict[str, Any]:
        """What ``recover()`` found that concerns this run (the store may hold other agents' state)."""
        key = self.names["session"]
        return {
            "ok": report.ok,
            "orphaned_tool_calls": report.orphaned_tool_calls.get(key, []),
            "tool_calls_in_doubt": [s.call_id for s in report.tool_calls_in_doubt if s.session_key == key],
            "steps_in_doubt": [s.step_key for s in report.steps_in_doubt if s.task_id == task_id],
            "interrupted_tasks": [t.title for t in report.interrupted_tasks if t.id == task_id],
            "pending_approvals": [
                a.id for a in report.pending_approvals if a.subject == self.names["subject"]
            ],
            "unfinished_workflows": [w.name for w in report.unfinished_workflows if w.id == self.workflow_id],
            "audit_ok": None if report.audit is None else report.audit.ok,
            "summary": report.summary(),
        }

    async def run(self) -> None:
        self.span(self.root_span, "agent run", "agent")
        if not await self.claim():
            return
        sessions = self.store.sessions
        async with sessions.open(self.names["session"]) as session:
            for call in session.repaired:
                self.say(f"open() answered {call.call_id} as interrupted: its process is gone", "recover")
            self.acked_seq = session.head_seq - len(session.messages)
            self.ack_messages(session)
            if not session.messages:
                session.add_message("user", REQUEST)
                await sessions.save(session)
                self.ack_messages(session)
                self.say(f"user: {REQUEST}", "user")
                await self.point(USER_SAVED)
            while True:
                for call in session.pending_calls():
                    await self.execute(session, call)
                last = session.messages[-1]
                if last.get("role") == "assistant" and not last.get("tool_calls"):
                    break
                message = model(session.history())
                session.add_item(message)
                await sessions.save(session)
                self.ack_messages(session)
                if message.get("tool_calls"):
                    call = message["tool_calls"][0]
                    asked = f"{call['function']['name']}({_short(json.loads(call['function']['arguments']))})"
                    self.say(f"model: {message['content'] or f'calls {asked}'}", "model")
                    if call["id"] == "call_read_log":
                        await self.point(CALL_SAVED)
                else:
                    self.say(f"model: {message['content']}", "model")
            await self.finish(session)

    async def finish(self, session: Session) -> None:
        await self.point(ANSWERED)
        task = await self.store.tasks.transition(
            self.task_id,
            "success",
            result={"answer": session.messages[-1]["content"]},
            worker_id=self.worker,
            lease_epoch=self.lease_epoch,
        )
        self.send(ack="task", task_id=task.id, status=task.status)
        await self.store.workflows.advance(self.workflow_id)
        self.span(self.root_span, "agent run", "agent", end=True)
        await self.flush_spans()
        self.say(f"task {task.status}; workflow advanced")

    # --- tool calls --------------------------------------------------------------------------------------

    @staticmethod
    def arguments(session: Session, call_id: str) -> dict[str, Any]:
        for message in reversed(session.messages):
            for call in message.get("tool_calls") or ():
                if call["id"] == call_id:
                    return json.loads(call["function"]["arguments"])  # type: ignore[no-any-return]
        raise SystemExit(f"story agent: no arguments for tool call {call_id!r}")

    async def execute(self, session: Session, call: ToolCall) -> None:
        """Run one tool call through ``run_tool``. It is idempotent at this level because each side effect
        below it is a journaled task step that runs once; a step found in doubt is settled, then retried."""
        args = self.arguments(session, call.call_id)
        tools: dict[str, Callable[[dict[str, Any]], Awaitable[str]]] = {
            "read_log": self.read_log,
            "edit_file": self.edit_file,
            "run_tests": self.run_tests,
            "shell": self.shell,
        }
        tool = tools[call.name or ""]
        span_id = f"tool-{call.call_id}"
        self.span(span_id, call.name or "tool", "tool", call_id=call.call_id, arguments=args)
        while True:
            try:
                output = await self.store.sessions.run_tool(
                    session, call.call_id, lambda: tool(args), idempotent=True
                )
                break
            except StepInDoubt as exc:
                if "task_id" not in exc.fields:
                    raise
                await self.settle(exc.fields["record"].step_key, args)
        self.ack_messages(session)
        self.span(span_id, call.name or "tool", "tool", end=True, call_id=call.call_id, arguments=args)
        self.say(f"{call.name}({_short(args)}) -> {_gist(call.name, str(output))}", "tool")
        if call.name == "shell":
            await self.point(RELEASE_RECORDED)

    async def step(self, key: str, fn: Callable[[], Awaitable[Any]], *, idempotent: bool = False) -> Any:
        """A step of the task's journal, fenced by this process's lease."""
        result = await self.store.tasks.step(
            self.task_id, key, fn, idempotent=idempotent, lease_epoch=self.lease_epoch
        )
        self.send(ack="step", task_id=self.task_id, step_key=key, status="succeeded")
        return result

    async def record_file(self, rel: str) -> str:
        digest, size = await checksum_file(self.root / rel)
        await self.store.files.record(
            rel, digest, size, task_id=self.task_id, session_key=self.names["session"]
        )
        self.send(ack="file", path=rel, sha256=digest)
        return digest

    async def read_log(self, args: dict[str, Any]) -> str:
        text: str = (self.root / args["path"]).read_text(encoding="utf-8")
        ws.count_effect(self.root, "read_log")
        await self.point(LOG_READ)
        return text

    async def edit_file(self, args: dict[str, Any]) -> str:
        rel, old, new = args["path"], args["old"], args["new"]

        async def edit() -> dict[str, Any]:
            await self.point(EDIT_STARTED)
            path = self.root / rel
            text = path.read_text(encoding="utf-8")
            if old not in text:
                raise ValueError(f"{rel} does not contain {old!r}")
            ws.write_private(path, text.replace(old, new, 1))
            ws.count_effect(self.root, "edit", path=rel)
            digest = await self.record_file(rel)
            await self.point(EDIT_DONE)
            return {"path": rel, "sha256": digest}

        done = await self.step(STEP_EDIT, edit)
        memory = await self.store.memory.put(
            "semantic",
            "calc.add",
            "calc.add() subtracted its arguments; the fix is `return a + b`",
            scope=self.names["scope"],
            source=self.names["session"],
            actor=AGENT,
        )
        self.send(ack="memory", id=memory.id, key=memory.key)
        self.say("memory: calc.add() subtracted its arguments (semantic, kept for next time)", "memory")
        await self.point(EDIT_RECORDED)
        return f"edited {rel}: `{old}` -> `{new}` (sha256 {done['sha256'][:12]})"

    async def run_tests(self, args: dict[str, Any]) -> str:
        async def run() -> dict[str, Any]:
            proc = await asyncio.to_thread(ws.run_tests, self.root)
            ws.count_effect(self.root, "run_tests", exit_code=proc.returncode)
            # The timing unittest prints ("in 0.004s") is left out: the result is the same on every run.
            summary = " ".join(
                re.sub(r" in [0-9.]+s$", "", line)
                for line in proc.stderr.splitlines()
                if line.startswith(("Ran ", "OK", "FAILED"))
            )
            await self.point(TESTS_RAN)
            return {"exit_code": proc.returncode, "summary": summary}

        result = await self.step(STEP_TESTS, run, idempotent=True)
        return f"exit code {result['exit_code']}: {result['summary']}"

    async def shell(self, args: dict[str, Any]) -> str:
        """The risky command: runs only with a granted approval bound to exactly these arguments."""
        approvals = self.store.approvals
        subject = self.names["subject"]

        async def ask() -> str:
            approval = await approvals.request(subject, "shell", args, requested_by=AGENT)
            self.send(ack="approval", id=approval.id, status=approval.status)
            await self.point(ASKED)
            return approval.id

        approval_id = await self.step(STEP_ASK, ask)
        approval = await approvals.get(approval_id)
        assert approval is not None
        if approval.status == "pending":
            await self.point(PENDING)
            self.send(approval=approval_id, subject=subject, action="shell", args=args)
            await self._wait_for("decided")
            approval = await approvals.get(approval_id)
            assert approval is not None
            await self.point(GRANTED)
        if approval.status != "granted":
            return f"not run: the approval was {approval.status}"

        async def release() -> dict[str, Any]:
            current = await approvals.get(approval_id)
            assert current is not None
            if current.consumed_at is None:
                bound = await approvals.check(subject, "shell", args)
                if bound is None or bound.id != approval_id:
                    raise PermissionError(f"no granted approval is bound to {args}")
                used = await approvals.consume(approval_id, by=AGENT)
                self.send(ack="approval", id=used.id, status="consumed")
            elif current.consumed_by != AGENT:
                raise PermissionError(f"approval {approval_id} was used by {current.consumed_by}")
            proc = await asyncio.to_thread(_run, ws.python_argv(args["argv"]), self.root)
            ws.count_effect(self.root, "release", exit_code=proc[0])
            if proc[0] != 0:
                raise RuntimeError(f"the release failed: {proc[1]}")
            await self.record_file("VERSION")
            await self.record_file("CHANGELOG.md")
            await self.point(RELEASED)
            return {"output": proc[1].strip(), "version": (self.root / "VERSION").read_text().strip()}

        result = await self.step(STEP_RELEASE, release)
        await self.store.memory.put(
            "procedural",
            "calc.release",
            "release calc with `python tools/release.py patch` once the tests pass; it needs an approval",
            scope=self.names["scope"],
            source=self.names["session"],
            actor=AGENT,
        )
        return str(result["output"])

    # --- after a crash -----------------------------------------------------------------------------------

    async def settle(self, step_key: str, args: dict[str, Any]) -> None:
        """A step was found in doubt (started by a process that died before recording its outcome): look at
        the world to know whether its side effect happened, and record that outcome."""
        result: Any = None
        if step_key == STEP_EDIT:
            text = (self.root / ws.CALC_PATH).read_text(encoding="utf-8")
            done = ws.FIXED_LINE in text
            why = f"the file {'already holds' if done else 'does not hold'} the fix"
            if done:
                result = {"path": ws.CALC_PATH, "sha256": await self.ensure_recorded(ws.CALC_PATH)}
        elif step_key == STEP_RELEASE:
            version = (self.root / "VERSION").read_text(encoding="utf-8").strip()
            done = version == ws.NEXT_VERSION
            why = f"VERSION is {version}"
            if done:
                await self.ensure_recorded("VERSION")
                await self.ensure_recorded("CHANGELOG.md")
                result = {"output": f"released {version}", "version": version}
        elif step_key == STEP_ASK:
            approvals = self.store.approvals
            digest = approvals.args_hash(args)
            found = [
                a
                for a in await approvals.pending(limit=1000)
                if a.subject == self.names["subject"] and a.action == "shell" and a.args_hash == digest
            ]
            done = bool(found)
            why = "the request is in the store" if done else "no request was stored"
            result = found[0].id if done else None
        else:
            raise SystemExit(f"story agent: no way to settle step {step_key!r}")
        outcome = "succeeded" if done else "failed"
        await self.store.tasks.resolve_step(
            self.task_id, step_key, outcome, result=result, lease_epoch=self.lease_epoch
        )
        self.send(ack="step", task_id=self.task_id, step_key=step_key, status=outcome)
        self.send(resolved=step_key, outcome=outcome, why=why)
        after = "not run again" if done else "it runs again"
        self.say(f"{step_key!r} was in doubt; {why}: resolved {outcome}, {after}", "resolve")

    async def ensure_recorded(self, rel: str) -> str:
        """The file's checksum, recorded in the ledger unless its last record already says so."""
        digest, _ = await checksum_file(self.root / rel)
        records = await self.store.files.list(path=rel, task_id=self.task_id)
        if not records or records[-1].checksum != digest:
            await self.record_file(rel)
        return digest


def _run(argv: list[str], root: Path) -> tuple[int, str]:
    proc = subprocess.run(
        argv,
        cwd=root,
        env=ws.quiet_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, proc.stdout + proc.stderr


def _gist(tool: str | None, output: str) -> str:
    """The line of a tool's output worth showing in the story."""
    lines = output.strip().splitlines() or [""]
    if tool == "read_log":
        return next((line for line in lines if "Error" in line), lines[0])
    if tool == "edit_file":
        return lines[0].split(": ", 1)[-1].split(" (sha256")[0]
    return lines[0]


def _short(args: dict[str, Any]) -> str:
    if "argv" in args:
        return " ".join(args["argv"])
    if "path" in args:
        return str(args["path"])
    return ", ".join(f"{v}" for v in args.values() if isinstance(v, str))[:70]


async def main_async(url: str, root: Path, run_id: str, workflow_id: str) -> None:
    async with open_store(url) as store:
        await Agent(store, root, run_id, workflow_id).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m statekeel.demo.story_agent", description=__doc__)
    parser.add_argument("url")
    parser.add_argument("root", type=Path)
    parser.add_argument("run_id")
    parser.add_argument("workflow_id")
    args = parser.parse_args(argv)
    asyncio.run(main_async(args.url, args.root, args.run_id, args.workflow_id))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
