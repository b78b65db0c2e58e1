"""docs/cli.md is the commands' help as it is now, and documents every command."""

from __future__ import annotations

from pathlib import Path

import click

from statekeel.cli import main
from statekeel.cli.reference import commands, render

REFERENCE = Path(__file__).parent.parent.parent / "docs" / "cli.md"


def test_the_reference_is_up_to_date_with_the_help_text() -> None:
    assert REFERENCE.read_text() == render(), (
        "docs/cli.md is out of date: python -m statekeel.cli.reference > docs/cli.md"
    )


def test_every_command_is_documented() -> None:
    text = REFERENCE.read_text()
    names = [path for path, _ in commands()]
    for name in ("status", "doctor", "info", "recover", "sessions", "show", "tasks", "trace", "migrate"):
        assert f"statekeel {name}" in names
    for name in (
        "audit verify",
        "steps resolve",
        "calls resolve",
        "approvals list",
        "approvals decide",
        "tasks requeue",
        "tasks cancel",
        "schedules list",
        "schedules pause",
        "schedules resume",
        "schedules delete",
        "schedules next",
    ):
        assert f"statekeel {name}" in names
    for path in names:
        assert f"\n## {path}\n" in text, path
    top = [c for c in main.commands.values() if not c.hidden]
    subcommands = sum(len(c.commands) for c in top if isinstance(c, click.Group))
    assert len(names) == len(top) + subcommands
