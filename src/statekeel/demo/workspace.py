"""The story demo's world outside the store: a small Python project whose test fails, and a counter of
the side effects the agent had on it.

The project (``calc``) has a bug — ``add`` subtracts — a unittest suite that catches it, a ``VERSION``
file and a release script that bumps it (not idempotent: run twice, it releases twice). The log of the
failing run is made by really running the suite once when the workspace is created.

The counter (:data:`EFFECTS_FILE`, next to the project, never in the store) gets one JSON line per real
side effect, appended by the tool that had it, right after it: the demo's verdict on "exactly once"
reads it, so it cannot be fooled by what the store says about itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

PROJECT = "calc"
EFFECTS_FILE = "effects.log"
LOG_PATH = "logs/test-run.log"
CALC_PATH = "calc/__init__.py"
BUGGY_LINE = "    return a - b"
FIXED_LINE = "    return a + b"
FIRST_VERSION = "0.1.0"
NEXT_VERSION = "0.1.1"
# What the agent runs; "python" stands for the interpreter running the demo.
TEST_ARGV = ("python", "-m", "unittest")
RELEASE_ARGV = ("python", "tools/release.py", "patch")
# Effects that must happen exactly once; the others are idempotent (a re-run after a crash is fine).
NON_IDEMPOTENT = ("edit", "release")
IDEMPOTENT = ("read_log", "run_tests")

_FILES = {
    "calc/__init__.py": f'''"""A tiny calculator."""


def add(a, b):
{BUGGY_LINE}


def mul(a, b):
    return a * b
''',
    "tests/__init__.py": "",
    "tests/test_calc.py": """import unittest

from calc import add, mul


class CalcTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_add_negative(self):
        self.assertEqual(add(-1, 1), 0)

    def test_mul(self):
        self.assertEqual(mul(2, 3), 6)
""",
    "VERSION": f"{FIRST_VERSION}\n",
    "CHANGELOG.md": f"# Changelog\n\n## {FIRST_VERSION}\n- first release\n",
    "tools/release.py": '''"""Release: bump the version (patch, minor or major) and add a changelog entry."""

import sys
from pathlib import Path

part = sys.argv[1] if len(sys.argv) > 1 else "patch"
major, minor, patch = (int(x) for x in Path("VERSION").read_text().split("."))
if part == "major":
    major, minor, patch = major + 1, 0, 0
elif part == "minor":
    minor, patch = minor + 1, 0
else:
    patch += 1
version = f"{major}.{minor}.{patch}"
Path("VERSION").write_text(version + "\\n")
with open("CHANGELOG.md", "a") as fh:
    fh.write(f"\\n## {version}\\n- fix add()\\n")
print(f"released {version}")
''',
}


def python_argv(argv: tuple[str, ...] | list[str]) -> list[str]:
    """``argv`` with "python" replaced by this interpreter."""
    return [sys.executable if a == "python" else a for a in argv]


def quiet_env() -> dict[str, str]:
    """The environment the project's commands run in: no bytecode files left in the workspace."""
    return {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}


def run_tests(root: Path) -> subprocess.CompletedProcess[str]:
    """Run the project's test suite as a subprocess (its report is on stderr)."""
    return subprocess.run(
        python_argv(TEST_ARGV),
        cwd=root,
        env=quiet_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (owner-only), atomically: a kill never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def create(parent: Path) -> Path:
    """Create the project under ``parent`` (owner-only), with the log of its failing test run; its root."""
    root = parent / PROJECT
    for rel, text in _FILES.items():
        path = root / rel
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private(path, text)
    failing = run_tests(root)
    (root / "logs").mkdir(mode=0o700, exist_ok=True)
    write_private(
        root / LOG_PATH, f"$ {' '.join(TEST_ARGV)}\n{failing.stderr}exit code {failing.returncode}\n"
    )
    return root


def effects_path(root: Path) -> Path:
    """The side-effect counter of the project at ``root`` (next to it, outside the project)."""
    return root.parent / EFFECTS_FILE


def count_effect(root: Path, effect: str, **detail: Any) -> None:
    """Append one line for a side effect that just happened (O_APPEND: whole lines, never interleaved)."""
    line = json.dumps({"effect": effect, "pid": os.getpid(), **detail}) + "\n"
    fd = os.open(effects_path(root), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def read_effects(root: Path) -> Counter[str]:
    """How many times each side effect happened."""
    path = effects_path(root)
    if not path.exists():
        return Counter()
    lines = path.read_text(encoding="utf-8").splitlines()
    return Counter(json.loads(line)["effect"] for line in lines if line.strip())
