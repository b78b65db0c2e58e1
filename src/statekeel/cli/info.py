"""``statekeel info``: what a store holds and whether it is healthy (a view of ``Store.info()``)."""

from __future__ import annotations

import asyncio
import os

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import StatekeelError
from ..store import StoreInfo, open_store, sqlite_path
from . import main, redact_url


async def _gather(url: str) -> StoreInfo:
    # Inspecting a store must not upgrade it: an older agent would then find a schema too new for it.
    async with open_store(url, migrate=False) as store:
        return await store.info()


def _by_status(name: str, counts: dict[str, int]) -> str:
    detail = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()) if n)
    return f"{name}: {sum(counts.values())}" + (f" ({detail})" if detail else "")


def _size(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:.1f} MB"
    return f"{n / 1e3:.1f} kB" if n >= 1000 else f"{n} bytes"


def _print_facts(console: Console, facts: StoreInfo) -> None:
    console.print(f"[bold]{escape(facts.url)}[/bold] — schema version {facts.schema_version}")
    table = Table(show_edge=False)
    for column in ("version", "migration", "applied at"):
        table.add_column(column)
    for m in facts.migrations:
        table.add_row(str(m.version), m.name, m.applied_at.isoformat())
    console.print(table)
    for version, name in facts.pending_migrations:
        console.print(f"[yellow]pending migration[/yellow] {version} {escape(name)}")
    counts = facts.counts
    if counts is None:
        console.print("state counts: unavailable (see the integrity check)")
    else:
        console.print(_by_status("sessions", counts.sessions), markup=False)
        console.print(_by_status("tasks", counts.tasks), markup=False)
        console.print(_by_status("workflows", counts.workflows), markup=False)
        console.print(f"approvals pending: {counts.approvals_pending}")
        console.print(f"audit entries: {counts.audit_entries}")
    if facts.files is not None:
        console.print(
            f"database file: {_size(facts.files.database_bytes)}, WAL: {_size(facts.files.wal_bytes)}"
        )
    if facts.fallback_files:
        console.print(
            f"[yellow]fallback files waiting for replay: {facts.fallback_files}[/yellow] in "
            f"{escape(facts.fallback_dir or '')}"
        )


@main.command()
@click.pass_context
def info(ctx: click.Context) -> None:
    """Schema version, applied migrations, state counts, integrity check and fallback files of the store
    at --db.

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
        facts = asyncio.run(_gather(url))
    except StatekeelError as exc:
        console.print(
            f"[red]cannot open {escape(redact_url(url))}[/red]: {type(exc).__name__}: {escape(str(exc))}"
        )
        ctx.exit(1)
    _print_facts(console, facts)
    if facts.integrity:
        console.print("[red]integrity check found problems:[/red]")
        for problem in facts.integrity:
            console.print(f"  - {problem}", markup=False)
        ctx.exit(1)
    console.print("integrity check: ok")
