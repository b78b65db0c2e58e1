"""The ``statekeel`` command: a thin layer over the public API.

statekeel demo                 # the crash-and-resume demo, in a fresh temporary directory
statekeel info --db sqlite:///agent.db
statekeel --db postgresql://me@db-host/agents doctor

Every command takes ``--db URL`` (also accepted before the command name; the command's own wins), else
``$STATEKEEL_URL``, else ``sqlite:///statekeel.db``. Read commands never create, migrate or change a store;
read commands print JSON with ``--json``. An encrypted store's keys are read from the file named by
``--key-file PATH`` (else ``$STATEKEEL_KEY_FILE``), never from the command line; a store whose audit
chain is keyed, its audit key from ``--audit-key-file PATH`` (else ``$STATEKEEL_AUDIT_KEY_FILE``); a
store with a key ring, its ring from ``--keyring PATH`` (else ``$STATEKEEL_KEYRING``). Errors
are one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import logging
from typing import Any

import click

from ..store import redact_url, resolve_url
from .common import group_audit_key_option


class _UsageLine(click.UsageError):
    """A usage error said in one line that names the command's help, instead of click's usage block."""

    def show(self, file: Any = None) -> None:
        where = f" (see: {self.ctx.command_path} --help)" if self.ctx is not None else ""
        click.echo(f"Error: {self.format_message()}{where}", err=True, file=file)


def _one_line(exc: click.UsageError) -> click.UsageError:
    if isinstance(exc, _UsageLine | click.exceptions.NoArgsIsHelpError):
        return exc  # the help itself, when the command was given nothing
    return _UsageLine(exc.format_message(), ctx=exc.ctx)


class _Cli(click.Group):
    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            raise _one_line(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise _one_line(exc) from None


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    "url",
    default=None,
    metavar="URL",
    show_default="$STATEKEEL_URL, else sqlite:///statekeel.db",
    help="Store URL for commands that use a store (a command's own --db wins).",
)
@click.option(
    "--key-file",
    "key_file",
    default=None,
    metavar="PATH",
    show_default="$STATEKEEL_KEY_FILE, else no key",
    help="Encryption keys of the store for commands that open one (a command's own --key-file wins).",
)
@click.option(
    "--keyring",
    "keyring",
    default=None,
    metavar="PATH",
    show_default="$STATEKEEL_KEYRING, else none",
    help="Key ring of the store's per-subject data keys (open_store(keyring=...)), used with its keys.",
)
@group_audit_key_option
@click.version_option(package_name="statekeel")
@click.pass_context
def main(ctx: click.Context, url: str | None, key_file: str | None, keyring: str | None) -> None:
    """statekeel: a recoverable state layer for long-running, tool-executing AI agents."""
    # The library logs its findings as warnings for applications; a command prints them itself.
    logging.getLogger("statekeel").setLevel(logging.ERROR)
    ctx.obj = {"url": resolve_url(url), "key_file": key_file, "keyring": keyring}


from . import admin as _admin  # noqa: E402  (commands register themselves on ``main``)
from . import demo as _demo  # noqa: E402
from . import erase as _erase  # noqa: E402
from . import export as _export  # noqa: E402
from . import importing as _importing  # noqa: E402
from . import info as _info  # noqa: E402
from . import operate as _operate  # noqa: E402
from . import sessions as _sessions  # noqa: E402
from . import tasks as _tasks  # noqa: E402
from . import ui as _ui  # noqa: E402  (imports statekeel.ui only when the command runs)

__all__ = ["main", "redact_url"]
del _admin, _demo, _erase, _export, _importing, _info, _operate, _sessions, _tasks, _ui
