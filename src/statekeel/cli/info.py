"""``statekeel info``: what a store holds and whether it is healthy."""

from __future__ import annotations

import asyncio
import collections
import os

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import StatekeelError
from ..store import Store, open_store, sqlite_path
from . import main, redact_url


async def _gather(url: str) -> tuple[list[tuple[int, str, str]], list[str], dict[str, int]]:
    # Inspecting a store must not upgrade it: an older agent would then find a schema too new for it.
    async with open_store(url, migrate=False) as store:
        return await _facts(store)


async def _facts(store: Store) -> tuple[list[tuple[int, str, str]], list[str], dict[str, int]]:
    migrations = [(m.version, m.name, m.applied_at.isoformat()) for m in await store.backend.migrations()]
    problems = await store.backend.integrity_check()
    counts = collections.Counter([record.status async for record in store.sessions.iter()])
    return migrations, problems, dict(counts)


@main.command()
@click.pass_context
def info(ctx: click.Context) -> None:
    """Schema version, applied migrations, integrity check and session counts of the store at --db.

    Exits 1 if the store cannot be opened or its integrity check finds problems.
    """
    url: str = ctx.obj["url"]
    console = Console(highlight=False)
    if url.startswith("sqlite:"):
        try:
            path = sqlite_path(url)
        except StatekeelError as exc:
            raise click.BadParameter(str(exc), param_hint="--db") from None
        if path is not None and not os.path.exists(path):
            # Opening would create (and migrate) a new database: not what "info" should do.
            console.print(f"[red]no store at {escape(path)}[/red]; pass --db or set $STATEKEEL_URL")
            ctx.exit(1)
    try:
        migrations, problems, counts = asyncio.run(_gather(url))
    except StatekeelError as exc:
        console.print(
            f"[red]cannot open {escape(redact_url(url))}[/red]: {type(exc).__name__}: {escape(str(exc))}"
        )
        ctx.exit(1)
    version = max((m[0] for m in migrations), default=0)
    console.print(f"[bold]{escape(redact_url(url))}[/bold] — schema version {version}")
    table = Table(show_edge=False)
    for column in ("version", "migration", "applied at"):
        table.add_column(column)
    for version, name, applied_at in migrations:
        table.add_row(str(version), name, applied_at)
    console.print(table)
    total = sum(counts.values())
    detail = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    console.print(f"sessions: {total}" + (f" ({detail})" if detail else ""))
    if problems:
        console.print("[red]integrity check found problems:[/red]")
        for problem in problems:
            console.print(f"  - {problem}", markup=False)
        ctx.exit(1)
    console.print("integrity check: ok")
