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
as `postgresql://`. A URL is parsed by the parser the store opens it with, so every URL `open_store`
opens works here, several hosts with their ports included (`postgresql://u@h1:5432,h2:5432/db`,
`nats://h1:4222,h2:4222`).

- Read commands (`status`, `doctor`, `info`, `sessions`, `show`, `tasks`, `trace`, `audit verify`,
  `migrate --check`) never create, migrate or change a store; they print JSON with `--json`.
- The commands that settle what `recover` reports (`steps resolve`, `calls resolve`, `approvals
  decide`, `tasks requeue`, `tasks cancel`) each make one library call whose audit entry names the
  `--actor` (default `$USER`; without either they refuse) and commits with the change. What the store
  does not allow (a step not in doubt, an approval already decided, a finished task) is refused in one
  line, exit 1, nothing written. `recover` prints, under each item that needs a person, the commands
  that settle it.
- A store that does not exist is reported, never created (only `migrate --create` and a `copy`
  destination create one).
- An encrypted store (see encryption.md) is opened with the keys of a key file: `--key-file PATH` on
  every command that opens a store (also before the command name), else `$STATEKEEL_KEY_FILE`. Keys
  never go on the command line. The file holds one key per line as 64 hex digits (`openssl rand -hex
  32`), the current key first, older ones after it; blank lines and `#` comments are skipped. It must
  be owner-only (`chmod 600`): a file readable by group or others is refused, like ssh's keys; so is a
  missing, unreadable or malformed one, before the store is opened, without quoting the file.
- Without a key, counts, statuses and ids of an encrypted store show as usual; a command that would
  show an encrypted value (`show`) says that a key is needed. `copy` and `backup` move encrypted
  values as they are, without decrypting them: they need no key, and the copy is read with the same
  keys as the source. A copy replaces what the destination held (`--force`), so a copy between an
  encrypted and a plain store mixes nothing: the destination holds each value as the source did,
  sealed or in plaintext (to encrypt a plain copy afterwards: `rotate-key --encrypt-existing`).
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
