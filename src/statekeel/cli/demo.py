"""``statekeel demo``: the crash-and-resume demo (see :mod:`statekeel.demo`)."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import tempfile
from urllib.parse import urlsplit

import click
from rich.console import Console
from rich.markup import escape

from ..demo.report import render
from ..demo.runner import DemoFailed, run_demo
from . import main, redact_url


@main.command()
@click.option(
    "--db",
    "url",
    default=None,
    help="Store URL to write to (sqlite:/// or postgresql://). Default: a fresh owner-only temporary "
    "directory, removed afterwards unless --keep.",
)
@click.option("--keep", is_flag=True, help="Keep the temporary directory and its database.")
@click.option("--sessions", default=3, show_default=True, type=click.IntRange(1, 100))
@click.option(
    "--cycles", default=1, show_default=True, type=click.IntRange(1, 100), help="Write-and-kill runs."
)
@click.option("--seed", type=int, default=None, help="Seed of the random kill moments.")
@click.pass_context
def demo(
    ctx: click.Context, url: str | None, keep: bool, sessions: int, cycles: int, seed: int | None
) -> None:
    """A writer process appends agent turns and is killed with SIGKILL at a random moment; the store is
    reopened and every acknowledged message is verified. Exits 0 only if verified.

    $STATEKEEL_URL is not used: the demo never writes into your store unless you pass --db.
    """
    parent = ctx.parent
    if (
        url is None
        and parent is not None
        and parent.get_parameter_source("url") == click.core.ParameterSource.COMMANDLINE
    ):
        url = parent.params["url"]
    console = Console(highlight=False)
    tmpdir: str | None = None
    if url is None:
        tmpdir = tempfile.mkdtemp(prefix="statekeel-demo-")  # mode 0700
        url = "sqlite:///" + os.path.join(tmpdir, "demo.db")
        where = os.path.join(tmpdir, "demo.db") + ("" if keep else " (temporary, removed afterwards)")
    else:
        scheme = urlsplit(url).scheme
        if scheme not in ("sqlite", "postgresql", "postgres"):
            raise click.BadParameter(
                f"{url!r}: the writer is another process, so the store must be a sqlite:/// file or "
                "postgresql:// database",
                param_hint="--db",
            )
        where = redact_url(url)
    try:
        result = asyncio.run(run_demo(url, sessions=sessions, cycles=cycles, rng=random.Random(seed)))
    except DemoFailed as exc:
        console.print(f"[red bold]demo could not run[/red bold]: {escape(str(exc))}")
        ctx.exit(1)
    finally:
        if tmpdir is not None and not keep:
            shutil.rmtree(tmpdir, ignore_errors=True)
    render(console, result, where=where)
    ctx.exit(0 if result.ok else 1)
