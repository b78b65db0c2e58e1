"""``statekeel demo``: a coding agent killed with SIGKILL mid-job resumes with nothing lost or done twice
(see :mod:`statekeel.demo.story`); ``--stress`` is the writer stress demo (:mod:`statekeel.demo.runner`)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import click
from rich.console import Console
from rich.markup import escape

from ..demo import workspace
from ..demo.report import render
from ..demo.runner import DemoFailed, run_demo
from ..demo.story import run_story
from ..demo.story_agent import CRASH_POINTS
from ..demo.story_report import StoryPrinter, as_json
from ..errors import StatekeelError
from ..store import redact_url, resolve_url
from .common import console as make_console
from .common import visible
from .group import main


def _fail(ctx: click.Context, message: str) -> None:
    """Bad input: one line on stderr, exit code 2, nothing run."""
    click.echo(f"statekeel demo: {visible(message)}", err=True)
    ctx.exit(2)


def _int(ctx: click.Context, option: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        _fail(ctx, f"{option} must be an integer, got {value!r}")
    raise AssertionError("unreachable")


@main.command()
@click.option(
    "--db",
    "url",
    default=None,
    help="Store URL to run on (sqlite:/// or postgresql://). Default: a fresh SQLite file in an owner-only "
    "temporary directory, removed afterwards unless --keep.",
)
@click.option(
    "--crash-at",
    "crash_at",
    default=None,
    metavar="N",
    help=f"Kill the agent at crash point N (1-{len(CRASH_POINTS)}). Default: one drawn with --seed.",
)
@click.option("--seed", default=None, metavar="INT", help="Seed of the random crash point (default: any).")
@click.option("--json", "as_json_output", is_flag=True, help="Print one JSON object instead of the story.")
@click.option("--keep", is_flag=True, help="Keep the temporary directory (workspace and database).")
@click.option(
    "--stress",
    is_flag=True,
    help="The writer stress demo instead: a process appending agent turns "
    "is killed at a random moment and every acknowledged message is verified.",
)
@click.option("--sessions", default=None, type=click.IntRange(1, 100), help="--stress: sessions written [3].")
@click.option(
    "--cycles", default=None, type=click.IntRange(1, 100), help="--stress: write-and-kill runs [1]."
)
@click.pass_context
def demo(
    ctx: click.Context,
    url: str | None,
    crash_at: str | None,
    seed: str | None,
    as_json_output: bool,
    keep: bool,
    stress: bool,
    sessions: int | None,
    cycles: int | None,
) -> None:
    """A scripted coding agent (no LLM, no network) fixes a failing test in a temporary project: it reads
    the failing log, edits a file, runs the tests, asks approval for a release, and is killed with SIGKILL
    at one of its crash points. Started again, it recovers, resumes and finishes; the demo then checks
    that every non-idempotent side effect happened exactly once (or was surfaced in doubt and resolved),
    that the transcript is valid for the next LLM call, and that every acknowledged write survived.
    Exits 0 only if every check passes.

    $STATEKEEL_URL is not used: the demo never writes into your store unless you pass --db.
    """
    parent = ctx.parent
    if (
        url is None
        and parent is not None
        and parent.get_parameter_source("url") == click.core.ParameterSource.COMMANDLINE
    ):
        url = parent.params["url"]
    seed_value = _int(ctx, "--seed", seed)
    crash_value = _int(ctx, "--crash-at", crash_at)
    if stress:
        if crash_value is not None or as_json_output:
            _fail(ctx, "--crash-at and --json belong to the story demo, not to --stress")
    elif sessions is not None or cycles is not None:
        _fail(ctx, "--sessions and --cycles belong to --stress")
    if crash_value is not None and not 1 <= crash_value <= len(CRASH_POINTS):
        _fail(ctx, f"--crash-at must be between 1 and {len(CRASH_POINTS)}, got {crash_value}")
    if url is not None:
        url = resolve_url(url)  # postgresql+asyncpg:// as every other command takes it
    if url is not None and urlsplit(url).scheme not in ("sqlite", "postgresql", "postgres"):
        _fail(
            ctx,
            f"--db {redact_url(url)!r}: the agent is another process, so the store must be a sqlite:/// "
            "file or a postgresql:// database",
        )
    console = make_console()
    started = time.perf_counter()
    # The story's project lives in a temporary directory even on a given store; the stress demo needs
    # one only for its database.
    tmpdir = tempfile.mkdtemp(prefix="statekeel-demo-") if url is None or not stress else None  # 0700
    try:
        if url is None:
            assert tmpdir is not None
            db = os.path.join(tmpdir, "demo.db" if stress else "state.db")
            url = "sqlite:///" + db
            where = db + ("" if keep else " (temporary, removed afterwards)" if stress else " (temporary)")
        else:
            where = redact_url(url)
        if stress:
            _stress(ctx, console, url, where, sessions or 3, cycles or 1, seed_value)
        else:
            assert tmpdir is not None
            story = _Story(url, where, Path(tmpdir), crash_value, seed_value, as_json_output, keep, started)
            _story(ctx, console, story)
    finally:
        if tmpdir is not None and not keep:
            shutil.rmtree(tmpdir, ignore_errors=True)


def _stress(
    ctx: click.Context, console: Console, url: str, where: str, sessions: int, cycles: int, seed: int | None
) -> None:
    try:
        result = asyncio.run(run_demo(url, sessions=sessions, cycles=cycles, rng=random.Random(seed)))
    except DemoFailed as exc:
        console.print(f"[red bold]demo could not run[/red bold]: {escape(str(exc))}")
        ctx.exit(1)
    render(console, result, where=where)
    ctx.exit(0 if result.ok else 1)


@dataclass(frozen=True, slots=True)
class _Story:
    url: str
    where: str
    tmpdir: Path
    crash_at: int | None
    seed: int | None
    as_json: bool
    keep: bool
    started: float


def _story(ctx: click.Context, console: Console, opts: _Story) -> None:
    seed = opts.seed
    crash_at = opts.crash_at
    if crash_at is None:
        if seed is None:
            seed = random.SystemRandom().randrange(2**31)  # printed, so that a run can be replayed
        crash_at = random.Random(seed).randint(1, len(CRASH_POINTS))
    else:
        seed = None  # the crash point was chosen: no seed was used
    root = workspace.create(opts.tmpdir)
    printer = None
    if not opts.as_json:
        printer = StoryPrinter(console)
        shown = str(root)
        printer.header(store=opts.where, workspace=shown, crash_at=crash_at, seed=seed)
    try:
        result = asyncio.run(run_story(opts.url, root, crash_at=crash_at, listen=printer))
    except StatekeelError as exc:  # StoryFailed, or a store that cannot be opened
        if opts.as_json:
            click.echo(json.dumps({"ok": False, "error": str(exc)}))
        else:
            console.print(f"[red bold]demo could not run[/red bold]: {escape(str(exc))}")
        ctx.exit(1)
    result.elapsed_s = time.perf_counter() - opts.started  # the whole demo, workspace included
    if opts.as_json:
        account = as_json(result, store=opts.where, workspace=str(root), seed=seed)
        sys.stdout.write(json.dumps(account) + "\n")
    else:
        assert printer is not None
        printer.verdict(result)
    ctx.exit(0 if result.ok else 1)
