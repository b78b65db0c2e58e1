"""Helpers shared by several test files (``tests/`` is on ``sys.path``: ``from helpers import ...``).

Fixtures live in ``conftest.py``; plain functions and constants live here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import itertools
import json
import math
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pydantic
import pytest
from typing_extensions import is_typeddict

import statekeel
from statekeel.backends.base import NewMessage
from statekeel.transcripts import Dialect

CHAT, RESPONSES, ANTHROPIC = Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES, Dialect.ANTHROPIC
Message = dict[str, Any]

# Text that no backend may store: NUL (PostgreSQL TEXT refuses it) and a lone surrogate (not UTF-8).
BAD_TEXT = ["a\x00b", "a\ud800b"]

# Floats a JSON number on PostgreSQL (JSONB ``numeric``) would turn into an int or lose the sign of, and
# ordinary ones.
FLOATS = [1e16, -1e16, 1.2345e20, 1e300, -1.7976931348623157e308, -0.0, 0.0, 1.0, 0.1, 1.5e-7, 5e-324]


def sqlite_url(path: str | os.PathLike[str]) -> str:
    return f"sqlite:///{os.fspath(path)}"


def exists(path: str) -> bool:
    """``os.path.exists`` under a name the async lint rules do not flag in async tests."""
    return os.access(path, os.F_OK)


def message(store: statekeel.Store, content: Any, role: str = "user") -> NewMessage:
    """A message as the backend contract takes it (``append_messages``)."""
    return NewMessage(role, store.codec.encode({"role": role, "content": content}))


async def contents(store: statekeel.Store, key: str) -> list[Any]:
    """The ``content`` of a session's live (not archived) messages, checking their seqs are dense."""
    found = await store.backend.load_session_with_messages(key)
    assert found is not None
    record, rows = found
    assert [r.seq for r in rows] == list(range(record.last_consolidated, record.head_seq))
    return [r.payload["content"] for r in rows]


async def granted_approval(
    store: statekeel.Store, subject: str, args: Any, requested_by: str
) -> statekeel.Approval:
    """An approval of ``shell`` with ``args`` on ``subject``, requested and granted (by alice)."""
    approval = await store.approvals.request(subject, "shell", args, requested_by)
    return await store.approvals.decide(approval.id, True, "alice", reason="build dir only")


def same_value(a: Any, b: Any) -> bool:
    """Equal, of the same type, and with the same sign for zeros (``-0.0 == 0.0`` in Python).

    Dict key order is not compared: PostgreSQL's JSONB gives keys back in its own order.
    """
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return bool(a == b)


@contextlib.contextmanager
def database_write_locked(db: Path) -> Iterator[None]:
    """Hold SQLite's write lock from another connection: every write of the store fails after its
    busy timeout with BackendUnavailable (reads still work: WAL)."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def run_together(commands: Sequence[Sequence[str]], *, timeout: float) -> list[str]:
    """Start one process per command, release them at the same moment, and return their outputs.

    Each process prints ``ready``, waits for a line on stdin (the barrier), works, and exits 0; a process
    that fails fails the test with its stderr. The returned outputs do not include the ``ready`` line.
    """
    procs = [
        subprocess.Popen(
            list(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:  # release them together
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = []
        for i, proc in enumerate(procs):
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, f"process {i} failed ({proc.returncode}):\n{err}"
            outputs.append(out)
        return outputs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def kill9_when(args: Sequence[str], reached: Callable[[], bool], what: str) -> None:
    """Start ``python -c *args``, wait (at most 60 s) until ``reached()`` says it got to ``what``, SIGKILL it
    and check that the signal is what ended it. A child that exits first fails the test with its stderr."""
    proc = subprocess.Popen([sys.executable, "-c", *args], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not reached():
            if proc.poll() is not None:
                raise AssertionError(
                    f"the child exited before {what}: {proc.stderr.read() if proc.stderr else ''}"
                )
            assert time.monotonic() < deadline, f"the child never got to {what}"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def _mariadb_connect_kwargs(url: str) -> dict[str, Any]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": parts.username or "root",
        "password": parts.password or "",
        "db": parts.path.lstrip("/"),
        "autocommit": True,
        "connect_timeout": 5,
    }


async def mariadb_raw(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Run ``sql`` (``?1``/``$1`` parameters) on a MariaDB store's database, behind statekeel's back."""
    import asyncmy

    from statekeel.backends.mysql.queries import compile_statement

    conn = await asyncmy.connect(**_mariadb_connect_kwargs(url))
    try:
        async with conn.cursor() as cur:
            if args:
                statement = compile_statement(re.sub(r"\?(\d+)", r"$\1", sql))
                await cur.execute(statement.text, [args[i] for i in statement.order])
            else:  # sent as written (a trigger's body holds ';')
                await cur.execute(sql)
            return [tuple(r) for r in await cur.fetchall()] if cur.description else []
    finally:
        conn.close()


class RawDb:
    """A raw connection to a store's database (SQLite, PostgreSQL or MariaDB) that bypasses statekeel.

    ``unguarded`` names a table whose triggers are switched off around the statement (and restored in the
    same transaction): a change made behind statekeel's guards.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.pg = url.startswith("postgresql")

    async def execute(self, sql: str, *args: Any, unguarded: str | None = None) -> None:
        if self.url.startswith("mariadb"):
            triggers: list[str] = []
            if unguarded:
                names = await mariadb_raw(
                    self.url,
                    "SELECT trigger_name FROM information_schema.triggers "
                    "WHERE trigger_schema = DATABASE() AND event_object_table = ?1",
                    unguarded,
                )
                for (name,) in names:
                    triggers.append((await mariadb_raw(self.url, f"SHOW CREATE TRIGGER `{name}`"))[0][2])
                    await mariadb_raw(self.url, f"DROP TRIGGER `{name}`")
            try:
                await mariadb_raw(self.url, sql.replace("?", "?1") if args else sql, *args)
            finally:
                for trigger_sql in triggers:
                    await mariadb_raw(self.url, trigger_sql)
            return
        if self.pg:
            import asyncpg

            conn = await asyncpg.connect(self.url)
            try:
                async with conn.transaction():
                    if unguarded:
                        await conn.execute(f"ALTER TABLE {unguarded} DISABLE TRIGGER USER")
                    await conn.execute(sql.replace("?", "$1") if args else sql, *args)
                    if unguarded:
                        await conn.execute(f"ALTER TABLE {unguarded} ENABLE TRIGGER USER")
            finally:
                await conn.close()
            return
        conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                triggers = conn.execute(
                    "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?",
                    (unguarded,),
                ).fetchall()
                for name, _ in triggers:
                    conn.execute(f'DROP TRIGGER "{name}"')
                conn.execute(sql, args)
                for _, trigger_sql in triggers:
                    conn.execute(trigger_sql)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        finally:
            conn.close()

    async def refused(self, sql: str, *args: Any) -> str:
        """Run ``sql`` with the triggers in place; return the database's refusal message."""
        if self.url.startswith("mariadb"):
            import asyncmy

            with pytest.raises(asyncmy.errors.OperationalError) as my_info:
                await self.execute(sql, *args)
            return str(my_info.value)
        if self.pg:
            import asyncpg

            with pytest.raises(asyncpg.RestrictViolationError) as pg_info:
                await self.execute(sql, *args)
            return str(pg_info.value)
        with pytest.raises(sqlite3.IntegrityError) as info:
            await self.execute(sql, *args)
        return str(info.value)


# --- transcripts: the providers' type definitions, strict, and their pairing rules ------------------------


def _typeddicts(tp: Any, found: set[type]) -> None:
    if is_typeddict(tp):
        if tp not in found:
            found.add(tp)
            for hint in typing.get_type_hints(tp, include_extras=True).values():
                _typeddicts(hint, found)
        return
    for arg in typing.get_args(tp):
        _typeddicts(arg, found)


@contextlib.contextmanager
def strict_provider_types() -> Iterator[dict[Dialect, pydantic.TypeAdapter[Any]]]:
    """Adapters for the three roots whose every TypedDict refuses unknown keys, as the APIs do (the
    ``provider_types`` fixture). The SDKs are imported here: most tests never need them."""
    import anthropic.types as anthropic_types
    import openai.types.chat as chat_types
    import openai.types.responses as responses_types

    roots = {
        CHAT: chat_types.ChatCompletionMessageParam,
        RESPONSES: responses_types.ResponseInputItemParam,
        ANTHROPIC: anthropic_types.MessageParam,
    }
    found: set[type] = set()
    for root in roots.values():
        _typeddicts(root, found)
    saved = {tp: tp.__dict__.get("__pydantic_config__") for tp in found}
    for tp in found:
        tp.__pydantic_config__ = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    try:
        yield {dialect: pydantic.TypeAdapter(root) for dialect, root in roots.items()}
    finally:
        for tp, config in saved.items():
            if config is None:
                del tp.__pydantic_config__
            else:
                tp.__pydantic_config__ = config


def _consume(value: Any) -> None:
    """pydantic validates ``Iterable[...]`` fields lazily: walk them so that nested items are checked."""
    if isinstance(value, Mapping):
        for v in value.values():
            _consume(v)
    elif isinstance(value, list | tuple):
        for v in value:
            _consume(v)
    elif isinstance(value, Iterator):
        for v in list(value):
            _consume(v)


def type_errors(
    adapters: dict[Dialect, pydantic.TypeAdapter[Any]], dialect: Dialect, messages: Sequence[Any]
) -> list[str]:
    errors = []
    for i, message in enumerate(messages):
        try:
            _consume(adapters[dialect].validate_python(message))
        except pydantic.ValidationError as exc:
            errors.append(f"messages[{i}] {message!r}: {exc.error_count()} errors, e.g. {exc.errors()[0]}")
    return errors


# --- the providers' pairing rules, written independently ---------------------------------------------------


def _chat_problems(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    problems = []
    i = 0
    while i < len(messages):
        m = messages[i]
        i += 1
        if m.get("role") == "tool":
            problems.append(f"messages[{i - 1}]: tool message that follows no assistant tool calls")
            continue
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        if not calls:
            continue
        wanted = sorted(c["id"] for c in calls)
        got = []
        while i < len(messages) and messages[i].get("role") == "tool":
            got.append(messages[i]["tool_call_id"])
            i += 1
        if sorted(got) != wanted:
            problems.append(f"tool calls {wanted} answered by {sorted(got)}")
    return problems


_ANSWERED_BY = {
    "function_call_output": {"function_call", "local_shell_call"},
    "custom_tool_call_output": {"custom_tool_call"},
    "computer_call_output": {"computer_call"},
    "local_shell_call_output": {"local_shell_call"},
    "shell_call_output": {"shell_call"},
    "apply_patch_call_output": {"apply_patch_call"},
    "tool_search_output": {"tool_search_call"},
}
RESPONSES_CALL_TYPES = set().union(*_ANSWERED_BY.values())


def _responses_problems(items: Sequence[Mapping[str, Any]], *, window: bool) -> list[str]:
    problems = []
    calls: dict[str, str] = {}
    answered: set[str] = set()
    for i, item in enumerate(items):
        kind = item.get("type")
        if kind in RESPONSES_CALL_TYPES and (kind != "tool_search_call" or item.get("execution") == "client"):
            calls[item["call_id"]] = kind
        elif kind in _ANSWERED_BY and (kind != "tool_search_output" or item.get("execution") == "client"):
            call_id = item.get("call_id") or item.get("id")
            if call_id not in calls or call_id in answered or calls[call_id] not in _ANSWERED_BY[kind]:
                problems.append(f"items[{i}]: {kind} for {call_id!r} answers no open call")
            answered.add(call_id)
    problems.extend(f"call {c!r} has no output" for c in calls if c not in answered)
    if window and items and items[-1].get("type") == "reasoning":
        problems.append("ends with a reasoning item")
    return problems


def _blocks(content: Any) -> list[Mapping[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _anthropic_problems(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    turns: list[tuple[str, list[Mapping[str, Any]]]] = []
    for m in messages:  # the API merges consecutive messages of one role into one turn
        if turns and turns[-1][0] == m["role"]:
            turns[-1][1].extend(_blocks(m["content"]))
        else:
            turns.append((m["role"], _blocks(m["content"])))
    problems = []
    for k, (role, blocks) in enumerate(turns):
        if role != "user":
            continue
        before = turns[k - 1][1] if k > 0 and turns[k - 1][0] == "assistant" else []
        uses = sorted(b["id"] for b in before if b["type"] == "tool_use")
        leading = list(itertools.takewhile(lambda b: b["type"] == "tool_result", blocks))
        if sorted(b["tool_use_id"] for b in leading) != uses:
            problems.append(f"turn {k}: tool_use {uses} answered by {[b['tool_use_id'] for b in leading]}")
        if any(b["type"] == "tool_result" for b in blocks[len(leading) :]):
            problems.append(f"turn {k}: tool_result after another block")
    if turns and turns[-1][0] == "assistant" and any(b["type"] == "tool_use" for b in turns[-1][1]):
        problems.append("the last turn's tool_use blocks have no results")
    return problems


def pairing_problems(
    dialect: Dialect, messages: Sequence[Mapping[str, Any]], *, window: bool = False
) -> list[str]:
    if dialect is CHAT:
        return _chat_problems(messages)
    if dialect is RESPONSES:
        return _responses_problems(messages, window=window)
    return _anthropic_problems(messages)


def assert_accepted(
    adapters: dict[Dialect, pydantic.TypeAdapter[Any]],
    dialect: Dialect,
    messages: Sequence[Mapping[str, Any]],
    *,
    window: bool = False,
) -> None:
    assert pairing_problems(dialect, messages, window=window) == []
    assert type_errors(adapters, dialect, messages) == []


# --- transcripts, as each provider's agent loop writes them


def user(text: str = "hi") -> Message:
    return {"role": "user", "content": text}


def assistant(text: str = "done") -> Message:
    return {"role": "assistant", "content": text}


def chat_calls(*ids: str) -> Message:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "run", "arguments": "{}"}} for i in ids
        ],
    }


def chat_result(call_id: str, text: str = "ok") -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def tool_use(*ids: str, text: str | None = None) -> Message:
    blocks: list[Message] = [{"type": "text", "text": text}] if text else []
    blocks += [{"type": "tool_use", "id": i, "name": "run", "input": {}} for i in ids]
    return {"role": "assistant", "content": blocks}


def tool_results(*ids: str, text: str | None = None) -> Message:
    blocks: list[Message] = [{"type": "tool_result", "tool_use_id": i, "content": "ok"} for i in ids]
    if text:
        blocks.append({"type": "text", "text": text})
    return {"role": "user", "content": blocks}


def responses_call(kind: str, call_id: str) -> Message:
    if kind == "function_call":
        return {"type": "function_call", "call_id": call_id, "name": "run", "arguments": "{}"}
    if kind == "custom_tool_call":
        return {"type": "custom_tool_call", "call_id": call_id, "name": "patch", "input": "x"}
    if kind == "computer_call":
        return {
            "type": "computer_call",
            "id": f"cu_{call_id}",
            "call_id": call_id,
            "action": {"type": "screenshot"},
            "pending_safety_checks": [],
            "status": "completed",
        }
    if kind == "local_shell_call":
        return {
            "type": "local_shell_call",
            "id": f"lsh_{call_id}",
            "call_id": call_id,
            "action": {"type": "exec", "command": ["ls"], "env": {}},
            "status": "completed",
        }
    if kind == "shell_call":
        return {"type": "shell_call", "call_id": call_id, "action": {"commands": ["ls"]}}
    if kind == "apply_patch_call":
        return {
            "type": "apply_patch_call",
            "call_id": call_id,
            "status": "completed",
            "operation": {"type": "delete_file", "path": "a.txt"},
        }
    assert kind == "tool_search_call"
    return {"type": "tool_search_call", "call_id": call_id, "arguments": {}, "execution": "client"}


def responses_output(kind: str, call_id: str, *, legacy_local_shell: bool = False) -> Message:
    if kind in ("function_call", "custom_tool_call") or (
        kind == "local_shell_call" and not legacy_local_shell
    ):
        out = "custom_tool_call_output" if kind == "custom_tool_call" else "function_call_output"
        return {"type": out, "call_id": call_id, "output": "ok"}
    if kind == "local_shell_call":  # the type definitions' shape: the call's id under ``id``
        return {"type": "local_shell_call_output", "id": call_id, "output": "ok"}
    if kind == "computer_call":
        return {
            "type": "computer_call_output",
            "call_id": call_id,
            "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="},
        }
    if kind == "shell_call":
        return {
            "type": "shell_call_output",
            "call_id": call_id,
            "output": [{"stdout": "a.txt", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
        }
    if kind == "apply_patch_call":
        return {"type": "apply_patch_call_output", "call_id": call_id, "status": "completed"}
    return {"type": "tool_search_output", "call_id": call_id, "tools": [], "execution": "client"}


RESPONSES_KINDS = sorted(RESPONSES_CALL_TYPES)


def model_calls(dialect: Dialect, *ids: str) -> list[Message]:
    """What a model's turn that asks for the tools ``ids`` adds to a transcript of ``dialect``."""
    if dialect is CHAT:
        return [chat_calls(*ids)]
    if dialect is ANTHROPIC:
        return [tool_use(*ids)]
    return [responses_call("function_call", i) for i in ids]


@dataclasses.dataclass(frozen=True)
class Prepared:
    """The store the UI tests browse (built in ``tests/ui/conftest.py``): what it holds, by name."""

    path: Path
    url: str
    evil_key: str  # a session key holding markup
    xss: str  # markup that changes the page's title if it ever runs
    tampered_seq: int  # the audit entry changed behind the triggers
    trace_id: str  # a trace of six spans: nested, one failed, one still open, one whose parent is missing
    task_with_steps: str
    running_task: str
    workflow_id: str
    pending_approvals: int

    def pages(self) -> list[str]:
        """A URL of every page of the prepared store, bad ones included."""
        return [
            "/",
            "/sessions",
            "/sessions?status=expired",
            *(
                f"/session?key={k}"
                for k in ("chat-openai", "responses-items", "anthropic-blocks", "compressed")
            ),
            "/session?key=" + self.evil_key,
            "/session?key=missing",
            "/tasks",
            "/tasks?status=running",
            f"/tasks?workflow={self.workflow_id}",
            f"/task?id={self.task_with_steps}",
            f"/task?id={self.running_task}",
            "/workflows",
            f"/workflow?id={self.workflow_id}",
            "/traces",
            "/traces?status=error",
            f"/trace?id={self.trace_id}",
            "/trace?id=missing",
            "/threads",
            "/approvals",
            "/audit",
            "/audit?after=0",
            "/audit?subject=repo",
            "/recovery",
            "/static/style.css",
        ]


def other_application_db(path: Path) -> bytes:
    """A SQLite database of another application at ``path`` (an ``invoices`` table, one row); its bytes."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    conn.execute("INSERT INTO invoices (total) VALUES (12.5)")
    conn.commit()
    conn.close()
    return path.read_bytes()


def run_statekeel(
    *args: str, cwd: Path, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``statekeel ARGS`` as a user runs it: a subprocess without a terminal or ``$STATEKEEL_URL`` (unless
    ``env`` gives one), and without the ``$COLUMNS`` / ``$LINES`` of the test runner (a pytest-xdist worker
    inherits its terminal's width there, which would fold the tables a pipe gets unfolded)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("STATEKEEL_URL", "COLUMNS", "LINES")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "statekeel.cli", *args],
        cwd=cwd,
        env=full_env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The error of a command that failed as it must: non-zero exit, one line on stderr, no traceback."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), lines[0]
    return lines[0]


SECRET_TEXT = "SECRET-TEXT-4711"


def write_key_file(path: Path, *keys: bytes, mode: int = 0o600) -> Path:
    """A key file for ``--key-file``: a comment, then each key as hex, current first; ``mode`` set."""
    path.write_text("# the current key first\n" + "".join(k.hex() + "\n" for k in keys))
    path.chmod(mode)
    return path


async def fill_sealed_session(url: str, key: bytes | None) -> None:
    """Session ``chat`` in the store at ``url``: a message holding :data:`SECRET_TEXT` and a tool call
    still without a result, sealed under ``key`` (in plaintext for None)."""
    async with statekeel.open_store(url, encryption_key=key) as store:
        chat = await store.sessions.get_or_create("chat")
        chat.add_message("user", f"tell me {SECRET_TEXT}")
        call = {"id": "call_ls", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        chat.add_message("assistant", None, tool_calls=[call])
        await store.sessions.save(chat)


@contextlib.contextmanager
def ui_process(*args: str, cwd: Path | None = None) -> Iterator[str]:
    """``statekeel ui`` in a subprocess on a free port; yields its base URL, then stops it (SIGTERM) and
    checks that it exited 0."""
    proc = subprocess.Popen(
        cwd=cwd,
        args=[sys.executable, "-m", "statekeel.cli", "ui", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "STATEKEEL_UI_TOKEN"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the socket listens
        found = re.search(r"at (http://\S+)", line)
        assert found, f"no address in {line!r}"
        yield found.group(1)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err


# --- the store the UI tests browse ------------------------------------------------------------------

XSS = '<script>document.title="pwned"</script><img src=x onerror="document.title=1">'
EVIL_KEY = 'evil-<script>alert("key")</script>'
TAMPERED_SEQ = 3
TRACE_ID = "trace-7f3a"


async def _items(store: statekeel.Store, key: str, items: list[dict[str, Any]]) -> None:
    """Append provider items as they are (Responses items have no role)."""
    batch = [NewMessage(str(item.get("role") or item["type"]), store.codec.encode(item)) for item in items]
    await store.backend.append_messages(key, 0, batch, create=True)


async def fill_ui_store(url: str) -> Prepared:
    """Fill the store at ``url`` with every kind of state the UI shows, hostile text, and an audit chain
    tampered with at one entry (see :class:`Prepared`)."""
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

        moved = await s.get_or_create("moved-on")
        moved.add_message("user", "deploy it")
        moved.add_message(
            "assistant",
            None,
            tool_calls=[{"id": "call_lost", "type": "function", "function": {"name": "deploy"}}],
        )
        moved.add_message("user", "hello? are you there?")
        await s.save(moved)

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
    path = (
        Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:") else Path()
    )  # no file on PostgreSQL
    return Prepared(
        path, url, EVIL_KEY, XSS, TAMPERED_SEQ, TRACE_ID, claimed.id, running.id, wf.id, pending_approvals=2
    )


# --- the store of the viewer's memories, files, vectors, usage and branches pages -------------------

LONG_ID = "id-" + "7c1e9a4b2d3f" * 12  # no place to break a line
LONG_PATH = "deep/" + "segment-0123456789abcdef" * 6 + "/notes.txt"
LONG_TEXT = "remember-" + "x7" * 400  # a memory's text without a space


@dataclasses.dataclass(frozen=True)
class Kinds:
    """What :func:`fill_kinds_store` put in the store, by name."""

    url: str
    root: Path  # the directory the ledger's paths are relative to
    drink: str  # a memory updated once (version 2), contradicted by ``evil``
    evil: str  # a memory whose text is markup (:data:`XSS`)
    long: str  # a memory of key LONG_ID and text LONG_TEXT, in a scope of LONG_ID
    old: str  # superseded by ``drink``
    gone: str  # forgotten
    usage: dict[int, dict[str, Any]]  # the usage recorded with each message of ``chat``, by seq

    def pages(self) -> list[str]:
        """A URL of every page that shows what this store holds."""
        return [
            "/memories",
            "/memories?all=1",
            "/memories?type=user",
            f"/memories?scope={LONG_ID}",
            f"/memory?id={self.drink}",
            f"/memory?id={self.long}",
            f"/memory?id={self.evil}",
            "/files",
            f"/files?path={LONG_PATH}",
            "/vectors",
            f"/vectors?source={self.drink}",
            "/session?key=chat",
            "/session?key=chat/retry",
            "/trace?id=chat",
            "/recovery",
        ]


def _write_file(root: Path, rel: str, text: str) -> tuple[str, int]:
    import hashlib

    path = root.joinpath(*rel.split("/"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    data = path.read_bytes()
    return hashlib.sha256(data).hexdigest(), len(data)


async def fill_kinds_store(url: str, root: Path) -> Kinds:
    """Memories (updated, superseded, forgotten, contradicting, hostile and unbreakably long), files under
    ``root`` (one unchanged, one changed since recorded, one missing, one of a very long path), vectors
    (a model, a memory and an announced source lagging), a session ``chat`` whose turns recorded their
    usage, forked twice (``chat/retry`` at 2 with a turn of its own, ``chat/other`` at 1), and the traces
    of ``chat`` (named after it) and ``chat/retry`` (named in a span's attributes)."""
    async with statekeel.open_store(url) as store:
        mem = store.memory
        old = await mem.put("user", "drink-then", "tea", scope="user:42")
        drink = await mem.put("user", "drink", "tea", scope="user:42", actor="agent-7")
        drink = await mem.put("user", "drink", "coffee", scope="user:42", reason="said so today")
        await mem.supersede(old.id, drink.id, reason="the newer one", actor="agent-7")
        evil = await mem.put("semantic", "note", XSS, scope="user:42", source=XSS)
        long = await mem.put("episodic", LONG_ID, LONG_TEXT, scope=LONG_ID)
        gone = await mem.put("procedural", "deploy", "run make deploy", scope="team")
        await mem.forget(gone.id, reason="obsolete", actor="alice")
        await mem.record_contradiction(drink.id, evil.id, "tea or coffee? " + XSS)

        ledger = store.files
        for rel, text in (("src/app.py", "print(1)\n"), ("src/changed.py", "a = 1\n"), ("docs/gone.md", "x")):
            digest, size = _write_file(root, rel, text)
            await ledger.record(rel, digest, size, action="created", session_key="chat")
        digest, size = _write_file(root, LONG_PATH, "long")
        await ledger.record(LONG_PATH, digest, size, action="created", task_id=LONG_ID)
        _write_file(root, "src/changed.py", "a = 2\n")
        root.joinpath("docs", "gone.md").unlink()

        await store.vectors.upsert(
            "v-drink", drink.id, [0.1, 0.2, 0.3], model="embed-small", source_version=1
        )
        await store.vectors.upsert("v-long", long.id, [0.3, 0.2, 0.1], model="embed-small", source_version=1)
        await store.vectors.source_changed("doc:readme", 3)
        await store.vectors.lagging()  # reads the memories' changes into the sources table

        usage = {
            1: {"model": "gpt-a", "input_tokens": 812, "output_tokens": 95, "cost": 0.0031},
            3: {"model": "gpt-b", "input_tokens": 40, "output_tokens": 7, "cost": 0.0},
        }
        chat = await store.sessions.get_or_create("chat")
        chat.add_message("user", "what should I drink?")
        chat.add_message("assistant", "coffee", usage=usage[1])
        chat.add_message("user", "why?")
        chat.add_message("assistant", "you said so", usage=usage[3])
        await store.sessions.save(chat)
        retry = await store.sessions.fork("chat", 2, new_key="chat/retry")
        retry.add_message("user", "and tea?", usage={"model": "gpt-a", "input_tokens": 5})
        await store.sessions.save(retry)
        await store.sessions.fork("chat", 1, new_key="chat/other")

        t0 = dt.datetime(2025, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
        store.traces.record("chat", {"span_id": "turn", "name": "agent turn", "started_at": t0})
        store.traces.record(
            "t-retry",
            {
                "span_id": "turn",
                "name": "retry",
                "started_at": t0,
                "attributes": {"session_key": "chat/retry"},
            },
        )
        await store.traces.flush()
    return Kinds(url, root, drink.id, evil.id, long.id, old.id, gone.id, usage)
