"""The ``statekeel`` command: a thin layer over the public API.

statekeel demo                 # the crash-and-resume demo, in a fresh temporary directory
statekeel --db sqlite:///agent.db info
"""

from __future__ import annotations

import os

import click

from ..store import redact_url

DEFAULT_URL = "sqlite:///statekeel.db"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    "url",
    default=lambda: os.environ.get("STATEKEEL_URL") or DEFAULT_URL,
    show_default="$STATEKEEL_URL, else sqlite:///statekeel.db",
    help="Store URL for commands that use a store.",
)
@click.version_option(package_name="statekeel")
@click.pass_context
def main(ctx: click.Context, url: str) -> None:
    """statekeel: a recoverable state layer for long-running, tool-executing AI agents."""
    ctx.obj = {"url": url}


from . import demo as _demo  # noqa: E402  (commands register themselves on ``main``)
from . import info as _info  # noqa: E402
from . import ui as _ui  # noqa: E402  (imports statekeel.ui only when the command runs)

__all__ = ["main", "redact_url"]
del _demo, _info, _ui
