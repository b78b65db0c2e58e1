"""The ``statekeel`` command: a thin layer over the public API.

statekeel demo                 # the crash-and-resume demo, in a fresh temporary directory
statekeel --db sqlite:///agent.db info
"""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import click

DEFAULT_URL = "sqlite:///statekeel.db"


def redact_url(url: str) -> str:
    """``url`` without its password (``user:password@`` or ``?password=``, both accepted by asyncpg)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    in_query = any(name == "password" for name, _ in query)
    if parts.password is None and not in_query:
        return url  # unchanged: a split/unsplit round trip would drop sqlite:////'s empty host
    if parts.password is not None:
        host = parts.netloc.rpartition("@")[2]
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{host}")
    if in_query:
        hidden = [(name, "***" if name == "password" else value) for name, value in query]
        parts = parts._replace(query=urlencode(hidden, safe="*"))
    return urlunsplit(parts)


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

__all__ = ["main"]
del _demo, _info
