"""The test run's own guards: a test that waits on an event that never comes fails after the per-test
timeout (pytest-timeout, configured in pyproject.toml) instead of hanging the whole run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_pytest_config_sets_a_per_test_timeout() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    options = config["tool"]["pytest"]["ini_options"]
    assert 60 <= int(options["timeout"]) <= 900
    dev = config["project"]["optional-dependencies"]["dev"]
    assert any(req.startswith("pytest-timeout") for req in dev)


def test_a_test_waiting_on_an_event_forever_fails_instead_of_hanging(tmp_path: Path) -> None:
    (tmp_path / "test_hang.py").write_text(
        textwrap.dedent(
            """
            import asyncio

            async def test_waits_for_an_event_nobody_sets():
                await asyncio.Event().wait()

            def test_after_it_runs():
                assert True
            """
        )
    )
    started = time.monotonic()
    # The project's own configuration, with the timeout shortened so that this test stays quick.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-o",
            "timeout=2",
            str(tmp_path / "test_hang.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert time.monotonic() - started < 100
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Timeout" in done.stdout
    assert "1 failed, 1 passed" in done.stdout


def test_the_mariadb_restart_test_fails_under_ci_when_its_variable_is_missing() -> None:
    import os

    # Not an xdist worker's environment: there the test waits for the serial phase and is skipped.
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "STATEKEEL_TEST_MARIADB_RESTART" and not k.startswith("PYTEST_XDIST")
    }
    env["CI"] = "true"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/reliability/test_mariadb_restart.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "STATEKEEL_TEST_MARIADB_RESTART is not 1" in done.stdout


FILE = str(ROOT / "tests" / "contract" / "test_session_rewind.py")


def test_a_backend_marker_selects_the_tests_of_that_backend_only() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co", "-m", "sqlite", FILE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    # The backend is one part of the id (``[sqlite]``, ``[sqlite-load]``); nats+sqlite never is.
    parts = [line.rsplit("[", 1)[1].rstrip("]").split("-") for line in ids]
    assert ids and all("sqlite" in p and "nats+sqlite" not in p for p in parts), ids
