"""The model test: random sequences of operations and faults (model/machine.py) run against every engine
and against a plain model of what each call promises (model/model.py); both must agree after every step.

Faults are rules of the machine: a reply lost after the write landed or before (PostgreSQL, MariaDB,
NATS: tests/faults.py at the driver boundary), SQLite's database unavailable (saves go to the fallback
file), kill -9 of the process, a second process writing between two calls, a rolled-back ``atomic()``.

CI runs a small budget per engine; ``STATEKEEL_MODEL_EXAMPLES`` and ``STATEKEEL_MODEL_STEPS`` run a long
one. A failure is shrunk by Hypothesis and written as a runnable script to ``$STATEKEEL_MODEL_REPLAY``
(a file; ``-{engine}`` is added before its suffix), or printed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from model.machine import StoreMachine, story_script

EXAMPLES = int(os.environ.get("STATEKEEL_MODEL_EXAMPLES", "10"))
STEPS = int(os.environ.get("STATEKEEL_MODEL_STEPS", "25"))
PROFILE = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# A long run outlasts the default per-test timeout: scale it.
pytestmark = pytest.mark.timeout(max(300, EXAMPLES * STEPS))


def run_model(engine: str, **config: Any) -> None:
    machine = type(f"{engine.replace('+', '_')}Machine", (StoreMachine,), {"engine": engine, **config})
    machine.TestCase.settings = PROFILE
    try:
        machine.TestCase().runTest()
    except BaseException:
        # Hypothesis runs the shrunk example last: its story is the one to tell.
        script = story_script(engine, machine.last_story)
        target = os.environ.get("STATEKEEL_MODEL_REPLAY")
        if target:
            path = Path(target)
            path = path.with_name(f"{path.stem}-{engine.replace('+', '_')}{path.suffix or '.py'}")
            path.write_text(script)
            print(f"the failing sequence, as a script: {path}", file=sys.stderr)
        else:
            print(f"the failing sequence, as a script:\n{script}", file=sys.stderr)
        raise


def test_memory_store_keeps_every_promise() -> None:
    run_model("memory")


def test_sqlite_store_keeps_every_promise() -> None:
    run_model("sqlite")


@pytest.mark.postgres
def test_postgres_store_keeps_every_promise(pg_template: str) -> None:
    run_model("postgres", pg_template=pg_template)


def test_mariadb_store_keeps_every_promise(my_clones: Any) -> None:
    run_model("mariadb", my_clones=my_clones)
