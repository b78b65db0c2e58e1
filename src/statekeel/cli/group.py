"""The ``statekeel`` click group (``main``) and its options: every command module registers on it, and
``statekeel.cli`` imports those modules; this module imports none of them."""

from __future__ import annotations

import logging
from typing import Any

import click

from ..store import resolve_url
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


__all__ = ["main"]
