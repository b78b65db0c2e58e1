"""The command-line reference, generated from the commands' own help: ``python -m statekeel.cli.reference``.

docs/cli.md is this module's output; a test checks that it is up to date and names every command.
"""

from __future__ import annotations

import click

from . import main

INTRO = """# Command-line reference

`statekeel` is a thin layer over the public API: each command is one library call, with its outcome
printed. Every command takes `--db URL` (also accepted before the command name; the command's own
wins), else `$STATEKEEL_URL`, else `sqlite:///statekeel.db`. `postgresql+asyncpg://` URLs are accepted
as `postgresql://`.

- Read commands (`status`, `doctor`, `info`, `sessions`, `show`, `tasks`, `trace`, `audit verify`,
  `migrate --check`) never create, migrate or change a store; they print JSON with `--json`.
- A store that does not exist is reported, never created (only `migrate --create` and a `copy`
  destination create one).
- Errors are one line on stderr (`Error: ...`) and a non-zero exit: 1 when the command could not do its
  job or found a problem, 2 for a usage error. Nothing is changed by a command that fails.

This page is generated from the commands' help: `python -m statekeel.cli.reference > docs/cli.md`.
"""


def commands(group: click.Group = main, prefix: str = "statekeel") -> list[tuple[str, click.Command]]:
    """Every command under ``group`` as (full name, command), groups followed by their subcommands."""
    found: list[tuple[str, click.Command]] = []
    for name in sorted(group.commands):
        command = group.commands[name]
        if command.hidden:
            continue
        path = f"{prefix} {name}"
        found.append((path, command))
        if isinstance(command, click.Group):
            found.extend(commands(command, path))
    return found


def _help(path: str, command: click.Command) -> str:
    # A fixed width: the page must not depend on the terminal it was generated in.
    ctx = click.Context(
        command, info_name=path, terminal_width=100, max_content_width=100, help_option_names=["-h", "--help"]
    )
    return command.get_help(ctx)


def render() -> str:
    """The whole reference page, as Markdown."""
    parts = [INTRO, "## statekeel\n", "```text", _help("statekeel", main), "```\n"]
    for path, command in commands():
        parts += [f"## {path}\n", "```text", _help(path, command), "```\n"]
    return "\n".join(parts)


if __name__ == "__main__":
    click.echo(render(), nl=False)
