"""``statekeel sessions``, ``show``, ``tasks`` and ``trace`` as a user runs them, on SQLite and
PostgreSQL: what they print, their ``--json``, and that reading changes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

import statekeel
from helpers import Prepared, one_line_error, run_statekeel

SESSIONS = {
    "chat-openai",
    "moved-on",
    "responses-items",
    "anthropic-blocks",
    "compressed",
    "old-expired",
    "old-archived",
}


def flat(text: str) -> str:
    return " ".join(text.split())


def as_json(filled: Prepared, cwd: Path, *args: str) -> Any:
    result = run_statekeel(*args, "--json", "--db", filled.url, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_sessions_lists_every_session_newest_first(filled: Prepared, tmp_path: Path) -> None:
    result = run_statekeel("sessions", "--db", filled.url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for key in SESSIONS:
        assert key in result.stdout
    assert "8 sessions" in result.stdout
    listed = as_json(filled, tmp_path, "sessions")
    assert {r["key"] for r in listed} == SESSIONS | {filled.evil_key}
    stamps = [r["updated_at"] for r in listed]
    assert stamps == sorted(stamps, reverse=True)
    archived = as_json(filled, tmp_path, "sessions", "--status", "archived")
    assert [r["key"] for r in archived] == ["old-archived"]
    two = as_json(filled, tmp_path, "sessions", "--limit", "2")
    assert [r["key"] for r in two] == [r["key"] for r in listed[:2]]
    # A call whose turn a user message followed still counts until a result for it is stored.
    calls = {r["key"]: r["open_calls"] for r in listed}
    assert calls["moved-on"] == 1 and calls["chat-openai"] == 1


def test_show_pairs_each_tool_call_with_its_result(filled: Prepared, tmp_path: Path) -> None:
    result = run_statekeel("show", "chat-openai", "--db", filled.url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = flat(result.stdout)
    assert '→ tool call run_tests {"path":"tests/"} (call_tests) ← result #3: 3 passed, 1 failed' in out
    assert "#3 tool result of call_tests, shown under #2" in out
    assert '→ tool call read_file {"path":"src/parse.py"} (call_read) … no result yet' in out
    anthropic = flat(run_statekeel("show", "anthropic-blocks", "--db", filled.url, cwd=tmp_path).stdout)
    assert "→ tool call list_dir" in anthropic and "← result #2: README.md src tests" in anthropic
    moved = flat(run_statekeel("show", "moved-on", "--db", filled.url, cwd=tmp_path).stdout)
    assert "✗ no result, and the transcript moved on" in moved


def test_show_marks_what_compression_archived(filled: Prepared, tmp_path: Path) -> None:
    out = flat(run_statekeel("show", "compressed", "--db", filled.url, cwd=tmp_path).stdout)
    assert "── archived #0 to #3" in out and "the user and the agent counted to three" in out
    assert "#0 user [archived] turn 0" in out
    assert "#3 assistant [archived] turn 3 ── end of archived part #4 user turn 4" in out
    shown = as_json(filled, tmp_path, "show", "compressed")
    assert [m["seq"] for m in shown["messages"]] == list(range(6))
    assert shown["archived"][0]["upto_seq"] == 4


def test_show_prints_markup_in_keys_and_messages_as_text(filled: Prepared, tmp_path: Path) -> None:
    result = run_statekeel("show", filled.evil_key, "--db", filled.url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert filled.xss in result.stdout
    assert filled.evil_key in result.stdout


def test_tasks_lists_by_status_and_workflow(filled: Prepared, tmp_path: Path) -> None:
    result = run_statekeel("tasks", "--db", filled.url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "11 tasks" in result.stdout and filled.running_task in result.stdout
    running = as_json(filled, tmp_path, "tasks", "--status", "running")
    assert {t["title"] for t in running} == {"index the repo", "long build"}
    in_workflow = as_json(filled, tmp_path, "tasks", "--workflow", filled.workflow_id)
    assert sorted(t["title"] for t in in_workflow) == ["build", "lint", "publish", "unit-tests"]


def test_trace_prints_a_tree_of_spans_with_durations(filled: Prepared, tmp_path: Path) -> None:
    result = run_statekeel("trace", filled.trace_id, "--db", filled.url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line.rstrip() for line in result.stdout.splitlines()]
    assert lines == [
        f"trace {filled.trace_id} — 6 spans, 1.5 s",
        "agent turn agent ok 1.5 s",
        "  └─ chat gpt-x llm ok 600 ms",
        "  └─ run_tests tool error 780 ms",
        "    └─ pytest -q tool ok 740 ms",
        "  └─ write summary llm unset open",
        "orphan span tool ok 30 ms (parent span not recorded)",
    ]
    spans = as_json(filled, tmp_path, "trace", filled.trace_id)
    assert len(spans) == 6


def test_show_and_trace_of_something_missing_exit_1_in_one_line(filled: Prepared, tmp_path: Path) -> None:
    assert "there is no session 'nobody'" in one_line_error(
        run_statekeel("show", "nobody", "--db", filled.url, cwd=tmp_path)
    )
    assert "there is no span of trace 'none'" in one_line_error(
        run_statekeel("trace", "none", "--db", filled.url, cwd=tmp_path)
    )


def test_read_commands_leave_the_database_file_unchanged(prepared: Prepared, tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    shutil.copyfile(prepared.path, path)
    filled = dataclasses.replace(prepared, path=path, url=f"sqlite:///{path}")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    for args in (
        ["status"],
        ["doctor"],
        ["info"],
        ["sessions"],
        ["show", "chat-openai"],
        ["tasks"],
        ["trace", filled.trace_id],
        ["audit", "verify"],
        ["migrate", "--check"],
        ["recover", "--dry-run"],
        ["gc", "--dry-run"],
    ):
        run_statekeel(*args, "--db", filled.url, cwd=tmp_path)
        assert hashlib.sha256(filled.path.read_bytes()).hexdigest() == before, args


def test_show_marks_the_fork_point_and_sessions_tree_nests_forks(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'forks.db'}"

    async def fill() -> None:
        async with statekeel.open_store(url) as store:
            s = await store.sessions.get_or_create("trunk")
            for i in range(4):
                s.add_message("user", f"turn {i}")
            await store.sessions.save(s)
            f = await store.sessions.fork("trunk", 2, new_key="retry")
            f.add_message("user", "another try")
            await store.sessions.save(f)
            await store.sessions.fork("retry", 3, new_key="retry-again")

    asyncio.run(fill())
    out = flat(run_statekeel("show", "retry", "--db", url, cwd=tmp_path).stdout)
    assert "a fork of trunk at #2" in out
    assert (
        "#1 user turn 1 ── fork point: #0 to #1 are trunk's, #2 on this fork's own ── #2 user another try"
        in out
    )
    shown = as_json_url(url, tmp_path, "show", "retry")
    assert shown["session"]["parent_key"] == "trunk" and shown["session"]["parent_seq"] == 2
    tree = run_statekeel("sessions", "--tree", "--db", url, cwd=tmp_path)
    assert tree.returncode == 0, tree.stderr
    lines = tree.stdout.splitlines()
    trunk = next(i for i, line in enumerate(lines) if line.lstrip("│├└─ ").startswith("trunk "))
    retry = next(i for i, line in enumerate(lines) if "retry (" in line)
    again = next(i for i, line in enumerate(lines) if "retry-again (" in line)
    assert trunk < retry < again
    indent = [len(line) - len(line.lstrip("│├└─ ")) for line in (lines[trunk], lines[retry], lines[again])]
    assert indent[0] < indent[1] < indent[2]
    assert "forked from trunk at #2" in lines[retry] and "forked from retry at #3" in lines[again]


def as_json_url(url: str, cwd: Path, *args: str) -> Any:
    result = run_statekeel(*args, "--json", "--db", url, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# What a terminal would act on: C0 controls but tab and newline, DEL, C1 controls.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
EVIL_KEY = "evil\x1b[2Jkey\x07"
OSC_TITLE = "\x1b]0;pwned\x07"
EVIL_TEXT = f"hello {OSC_TITLE} \x1b[31mred\x1b[0m \x9b2J back\x08\x08 cr\rDEL\x7f end"
EVIL_RESULT = "out\x1b]8;;http://attacker.example/\x07link\x1b]8;;\x07 \x9b31m"
EVIL_TITLE = "build\x1b]0;title\x07\x1b[8m"
EVIL_WORKER = "worker\x1b[1m"
EVIL_SPAN = "span\x1b[5m\x07"


async def _store_with_control_characters(path: Path) -> None:
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        session = await store.sessions.get_or_create(EVIL_KEY)
        session.add_message("user", EVIL_TEXT)
        call = {"id": "call\x1b[2K1", "type": "function"}
        call["function"] = {"name": "run\x1b[8m", "arguments": json.dumps({"cmd": "\x1b]0;x\x07"})}
        session.add_message("assistant", None, tool_calls=[call])
        session.add_message("tool", EVIL_RESULT, tool_call_id="call\x1b[2K1")
        open_call = {"id": "open\x1b[2Kcall", "type": "function"}
        open_call["function"] = {"name": "wait", "arguments": "{}"}
        session.add_message("assistant", None, tool_calls=[open_call])
        await store.sessions.save(session)
        await store.tasks.create(EVIL_TITLE, status="queued")
        assert await store.tasks.claim(EVIL_WORKER, lease_seconds=600) is not None
        store.traces.record(
            "trace\x1b[1m", {"span_id": "s1", "name": EVIL_SPAN, "attributes": {"k\x1b[1m": "v\x07\x9b"}}
        )
        await store.traces.flush()


def test_no_command_sends_control_characters_from_the_store_to_the_terminal(tmp_path: Path) -> None:
    path = tmp_path / "evil.db"
    asyncio.run(_store_with_control_characters(path))
    url = f"sqlite:///{path}"
    outputs: dict[str, str] = {}
    for args in (
        ("sessions",),
        ("show", EVIL_KEY),
        ("tasks",),
        ("trace", "trace\x1b[1m"),
        ("recover", "--dry-run"),
        ("doctor",),
        ("info",),
        ("status",),
        ("show", "nobody\x1b]0;x\x07"),  # an error that quotes what it was given
    ):
        result = run_statekeel(*args, "--db", url, cwd=tmp_path)
        assert "Traceback" not in result.stderr, result.stderr
        for stream in (result.stdout, result.stderr):
            found = CONTROL.findall(stream)
            assert not found, (args, found, stream)
        outputs[args[0] + ("" if args[0] != "show" or args[1] == EVIL_KEY else " missing")] = result.stdout
    show = outputs["show"]
    # Shown as cat -v shows them: ESC as ^[, BEL as ^G, backspace ^H, DEL ^?, C1 CSI as M-^[.
    assert "hello ^[]0;pwned^G ^[[31mred^[[0m M-^[2J back^H^H cr^MDEL^? end" in show
    assert "evil^[[2Jkey^G" in show and "run^[[8m" in show
    assert "out^[]8;;http://attacker.example/^Glink^[]8;;^G M-^[31m" in show
    assert "evil^[[2Jkey^G" in outputs["sessions"]
    tasks = " ".join(outputs["tasks"].split())
    assert "build^[]0;title^G^[[8m" in tasks and "worker^[[1m" in tasks
    assert "span^[[5m^G" in outputs["trace"]
    # --json is unchanged: the values as stored, control characters in JSON's own escapes.
    shown = json.loads(run_statekeel("show", EVIL_KEY, "--json", "--db", url, cwd=tmp_path).stdout)
    assert shown["session"]["key"] == EVIL_KEY
    assert shown["messages"][0]["message"]["content"] == EVIL_TEXT
    assert shown["messages"][2]["message"]["content"] == EVIL_RESULT
    listed = json.loads(run_statekeel("tasks", "--json", "--db", url, cwd=tmp_path).stdout)
    assert [(t["title"], t["lease_owner"]) for t in listed] == [(EVIL_TITLE, EVIL_WORKER)]
    spans = json.loads(run_statekeel("trace", "trace\x1b[1m", "--json", "--db", url, cwd=tmp_path).stdout)
    assert spans[0]["name"] == EVIL_SPAN and spans[0]["attributes"] == {"k\x1b[1m": "v\x07\x9b"}


def make_long_session(path: Path, key: str, text: str) -> str:
    async def fill() -> None:
        async with statekeel.open_store(f"sqlite:///{path}") as store:
            session = await store.sessions.get_or_create(key)
            session.add_message("user", text)
            await store.sessions.save(session)

    asyncio.run(fill())
    return f"sqlite:///{path}"


def test_into_a_pipe_a_long_key_and_message_stay_on_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    key = "k-" + "x" * 150
    text = "a long message " * 20 + "THE END"
    url = make_long_session(tmp_path / "long.db", key, text)
    listing = run_statekeel("sessions", "--db", url, cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert any(key in line for line in listing.stdout.splitlines()), listing.stdout
    shown = run_statekeel("show", key, "--db", url, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert any(text.strip() in line for line in shown.stdout.splitlines()), shown.stdout


def test_into_a_pipe_the_width_follows_columns_when_it_is_set(tmp_path: Path) -> None:
    key = "k-" + "x" * 150
    url = make_long_session(tmp_path / "long.db", key, "hello")
    listing = run_statekeel("sessions", "--db", url, cwd=tmp_path, env={"COLUMNS": "60"})
    assert listing.returncode == 0, listing.stderr
    assert max(len(line) for line in listing.stdout.splitlines()) <= 60
    assert not any(key in line for line in listing.stdout.splitlines())  # folded, never cut
