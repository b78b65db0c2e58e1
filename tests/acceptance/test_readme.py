"""The README's examples run as written (on a store in a temporary directory): the agent loop, killed with
SIGKILL and run again, and the tour."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from statekeel.transcripts import analyze

README = Path(__file__).resolve().parents[2] / "README.md"
DB_URL = "sqlite:///agent-state.db"


def _blocks(section: str) -> list[str]:
    """The python blocks of the README section whose heading starts with ``section``."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {section}")
    end = text.find("\n## ", start + 1)
    blocks = re.findall(r"```python\n(.*?)```", text[start : end if end > 0 else None], flags=re.S)
    assert blocks, f"the README section {section!r} lost its python blocks"
    return blocks


def _tour() -> str:
    first, second = _blocks("A short tour")[:2]
    # The second block continues inside the first block's `async with`.
    return first + textwrap.indent(second, "    ")


async def test_readme_tour_runs_as_written(tmp_path: Path) -> None:
    code = _tour().replace(DB_URL, f"sqlite:///{tmp_path / 'agent-state.db'}")
    applied: list[str] = []
    namespace: dict[str, object] = {"apply_patch": lambda name: applied.append(name) or name}
    exec(compile("async def tour():\n" + textwrap.indent(code, "    "), "README.md", "exec"), namespace)
    await namespace["tour"]()  # type: ignore[operator]
    assert applied == ["fix.diff"]


def _agent_loop(tmp_path: Path) -> tuple[Path, Path]:
    """The README's agent loop, as written but for its database path: (script, database)."""
    (code,) = _blocks("An agent loop")
    assert len(code.splitlines()) < 30
    db = tmp_path / "agent-state.db"
    assert DB_URL in code
    script = tmp_path / "agent.py"
    script.write_text(code.replace(DB_URL, f"sqlite:///{db}"), encoding="utf-8")
    return script, db


def _tool_started(db: Path) -> bool:
    """Whether the loop's tool is running: its call is journaled as started (read without statekeel)."""
    if not db.exists():
        return False
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        row = conn.execute("SELECT status FROM session_steps WHERE call_id = 'call_1'").fetchone()
    except sqlite3.OperationalError:  # the schema is not there yet
        return False
    finally:
        conn.close()
    return row is not None and row[0] == "started"


def _run(script: Path, *, kill_when_tool_runs: bool) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=script.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if kill_when_tool_runs:
            deadline = time.monotonic() + 60
            while not _tool_started(script.parent / "agent-state.db"):
                assert proc.poll() is None, f"the loop ended before its tool ran: {proc.communicate()}"
                assert time.monotonic() < deadline, "the loop's tool never started"
                time.sleep(0.02)
            os.kill(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_readme_agent_loop_killed_inside_its_tool_finishes_when_run_again(tmp_path: Path) -> None:
    script, db = _agent_loop(tmp_path)
    killed = _run(script, kill_when_tool_runs=True)
    assert killed.returncode == -signal.SIGKILL
    again = _run(script, kill_when_tool_runs=False)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == ["The tests say: 3 passed"]

    conn = sqlite3.connect(db)
    try:
        payloads = [r[0] for r in conn.execute("SELECT payload FROM messages ORDER BY seq")]
        attempts = conn.execute("SELECT status, attempt FROM session_steps").fetchall()
    finally:
        conn.close()
    messages = [json.loads(p) for p in payloads]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert analyze(messages).consistent  # one result for the one call
    assert attempts == [("succeeded", 2)]  # the idempotent tool ran again after the kill

    done = _run(script, kill_when_tool_runs=False)  # a finished conversation is left as it is
    assert done.stdout.splitlines() == ["The tests say: 3 passed"]
