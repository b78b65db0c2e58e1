"""A prepared store for the UI's tests: every kind of state the pages show, hostile text, and an audit
chain tampered with at one entry. Built once per test session; the tests only read it (one of them checks
that the file is byte-identical after every page was loaded)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import statekeel
from helpers import Prepared, RawDb, sqlite_url
from statekeel.backends.base import NewMessage

XSS = '<script>document.title="pwned"</script><img src=x onerror="document.title=1">'
EVIL_KEY = 'evil-<script>alert("key")</script>'
TAMPERED_SEQ = 3
TRACE_ID = "trace-7f3a"


async def _items(store: statekeel.Store, key: str, items: list[dict[str, Any]]) -> None:
    """Append provider items as they are (Responses items have no role)."""
    batch = [NewMessage(str(item.get("role") or item["type"]), store.codec.encode(item)) for item in items]
    await store.backend.append_messages(key, 0, batch, create=True)


async def fill(url: str) -> Prepared:
    async with statekeel.open_store(url) as store:
        s = store.sessions
        chat = await s.get_or_create("chat-openai")
        chat.metadata = {"agent": "coder", "user": "alice"}
        chat.add_message("system", "You are a careful coding agent.")
        chat.add_message("user", "run the tests and fix what fails")
        chat.add_message(
            "assistant",
            None,
            tool_calls=[
                {
                    "id": "call_tests",
                    "type": "function",
                    "function": {"name": "run_tests", "arguments": json.dumps({"path": "tests/"})},
                }
            ],
        )
        chat.add_message("tool", "3 passed, 1 failed: test_parse", tool_call_id="call_tests")
        chat.add_message("assistant", "One test fails; I will read the parser.")
        chat.add_message(
            "assistant",
            None,
            tool_calls=[
                {
                    "id": "call_read",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "src/parse.py"}'},
                }
            ],
        )
        await s.save(chat)

        await _items(
            store,
            "responses-items",
            [
                {"role": "user", "content": "what's the weather in Paris?"},
                {
                    "type": "function_call",
                    "call_id": "fc_weather",
                    "name": "get_weather",
                    "arguments": '{"city": "Paris"}',
                },
                {"type": "function_call_output", "call_id": "fc_weather", "output": "18°C, light rain"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "It is 18°C and raining in Paris."}],
                },
            ],
        )

        anthropic = await s.get_or_create("anthropic-blocks")
        anthropic.add_message("user", [{"type": "text", "text": "list the repository"}])
        anthropic.add_message(
            "assistant",
            [
                {"type": "text", "text": "Listing it."},
                {"type": "tool_use", "id": "toolu_ls", "name": "list_dir", "input": {"path": "."}},
            ],
        )
        anthropic.add_message(
            "user",
            [{"type": "tool_result", "tool_use_id": "toolu_ls", "content": "README.md\nsrc\ntests"}],
        )
        anthropic.add_message("assistant", [{"type": "text", "text": "Three entries."}])
        await s.save(anthropic)

        evil = await s.get_or_create(EVIL_KEY)
        evil.metadata = {"note": XSS}
        evil.add_message("user", XSS)
        evil.add_message(
            "assistant",
            None,
            tool_calls=[{"id": "call_x", "type": "function", "function": {"name": XSS, "arguments": XSS}}],
        )
        evil.add_message("tool", XSS, tool_call_id="call_x")
        await s.save(evil)

        folded = await s.get_or_create("compressed")
        for i in range(6):
            folded.add_message("user" if i % 2 == 0 else "assistant", f"turn {i}")
        await s.save(folded)
        await s.compress("compressed", 4, "the user and the agent counted to three")

        for key, status in (("old-expired", "expire"), ("old-archived", "archive")):
            old = await s.get_or_create(key)
            old.add_message("user", f"{key} says hi")
            await s.save(old)
            await s.expire(key)
            if status == "archive":
                await s.archive(key)

        tasks = store.tasks
        await tasks.create("write the changelog", priority=3)
        await tasks.create("triage issues", metadata={"label": "bug"})
        queued = await tasks.create("fix the parser", priority=9)
        await tasks.transition(queued.id, "queued")
        claimed = await tasks.claim("worker-7", lease_seconds=3600)
        assert claimed is not None and claimed.id == queued.id
        await tasks.step(
            claimed.id, "read-parser", lambda: "def parse(): ...", lease_epoch=claimed.lease_epoch
        )
        await tasks.step(claimed.id, "write-patch", lambda: {"lines": 12}, lease_epoch=claimed.lease_epoch)
        with pytest.raises(statekeel.SerializationError):
            # The step ran but its value cannot be stored: it stays started, in doubt once nobody runs it.
            await tasks.step(claimed.id, "push-branch", lambda: {1, 2}, lease_epoch=claimed.lease_epoch)
        await tasks.transition(
            claimed.id, "interrupted", worker_id="worker-7", lease_epoch=claimed.lease_epoch
        )
        live = await tasks.create("index the repo")
        await tasks.transition(live.id, "queued")
        running = await tasks.claim("worker-2", lease_seconds=3600)
        assert running is not None
        lapsed = await tasks.create("long build")
        await tasks.transition(lapsed.id, "queued")
        await tasks.claim("worker-dead", lease_seconds=0.001)
        done = await tasks.create("lint")
        await tasks.transition(done.id, "running")
        await tasks.transition(done.id, "success", result={"warnings": 0})
        broken = await tasks.create("deploy preview")
        await tasks.transition(broken.id, "running")
        await tasks.transition(broken.id, "failed", error={"type": "TimeoutError", "message": XSS})

        wf = await store.workflows.create(
            "release",
            [
                {"name": "build"},
                {"name": "unit-tests", "depends_on": ["build"]},
                {"name": "lint", "depends_on": ["build"]},
                {"name": "publish", "depends_on": ["unit-tests", "lint"]},
            ],
        )
        await store.workflows.start(wf.id)
        build = await tasks.claim("worker-wf", workflow_id=wf.id)
        assert build is not None
        await tasks.transition(build.id, "success", worker_id="worker-wf", lease_epoch=build.lease_epoch)
        await store.workflows.advance(wf.id)

        await store.approvals.request("repo", "deploy", {"env": "prod"}, requested_by="agent")
        await store.approvals.request("repo", "shell", {"cmd": XSS}, requested_by="agent")
        granted = await store.approvals.request("repo", "merge", {"pr": 12}, requested_by="agent")
        await store.approvals.decide(granted.id, True, "alice")
        await store.audit.append("tool.call", "agent", "task:1", {"tool": "run_tests", "note": XSS})
        await store.audit.append("tool.call", "agent", "task:1", {"tool": "read_file"})

        t0 = dt.datetime(2025, 3, 1, 12, 0, 0, tzinfo=dt.UTC)

        def at(ms: float) -> dt.datetime:
            return t0 + dt.timedelta(milliseconds=ms)

        spans = [
            ("root", None, "agent turn", "agent", "ok", 0, 1500, {"session": "chat-openai"}),
            ("llm-1", "root", "chat gpt-x", "llm", "ok", 10, 610, {"model": "gpt-x", "tokens": 812}),
            ("tool-1", "root", "run_tests", "tool", "error", 620, 1400, {"path": "tests/", "note": XSS}),
            ("sub-1", "tool-1", "pytest -q", "tool", "ok", 640, 1380, {"exit": 1}),
            ("open-1", "root", "write summary", "llm", "unset", 1410, None, {}),
            ("lost-1", "gone", "orphan span", "tool", "ok", 1420, 1450, {}),
        ]
        for span_id, parent, name, kind, status, start, end, attributes in spans:
            store.traces.record(
                TRACE_ID,
                {
                    "span_id": span_id,
                    "parent_span_id": parent,
                    "name": name,
                    "kind": kind,
                    "status": status,
                    "started_at": at(start),
                    "ended_at": None if end is None else at(end),
                    "attributes": attributes,
                },
            )
        await store.traces.flush()
    # Change entry 3 behind the append-only triggers: verify() must name it.
    await RawDb(url).execute(
        "UPDATE audit_log SET actor = 'mallory' WHERE seq = ?", TAMPERED_SEQ, unguarded="audit_log"
    )
    path = Path(url.removeprefix("sqlite:///"))
    return Prepared(
        path, url, EVIL_KEY, XSS, TAMPERED_SEQ, TRACE_ID, claimed.id, running.id, wf.id, pending_approvals=2
    )


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prepared]:
    """The prepared SQLite store (closed: its WAL checkpointed into the file)."""
    path = tmp_path_factory.mktemp("ui") / "agent-state.db"
    yield asyncio.run(fill(sqlite_url(path)))
