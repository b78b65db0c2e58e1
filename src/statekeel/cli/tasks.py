"""``statekeel tasks`` and ``statekeel trace TRACE_ID``: the task board and one trace as a tree of spans.

Both only read. ``trace`` orders spans the way the ui's waterfall does (each under its parent, children in
start order; a span whose parent was never recorded is marked).
"""

from __future__ import annotations

import datetime as dt

import click
from rich.markup import escape
from rich.table import Table

from ..backends.base import TASK_STATUSES, Span, TaskRecord
from ..store import redact_url
from ..ui.layout import waterfall
from ..wording import counted
from .common import (
    Failure,
    Keys,
    collect,
    console,
    echo_json,
    json_option,
    listing_console,
    open_for_reading,
    run,
    store_keys,
    store_options,
    store_url,
)
from .group import main


def _when(value: dt.datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


async def _tasks(
    url: str, keys: Keys | None, status: str | None, workflow: str | None, limit: int | None
) -> list[TaskRecord]:
    async with open_for_reading(url, keys) as store:
        return await collect(store.tasks.iter(workflow_id=workflow, status=status), limit)


@main.group(invoke_without_command=True)
@store_options
@json_option
@click.option("--status", type=click.Choice(TASK_STATUSES), default=None, help="Only tasks in this status.")
@click.option("--workflow", "workflow", default=None, metavar="ID", help="Only the tasks of this workflow.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many. Default: all.")
@click.pass_context
def tasks(
    ctx: click.Context,
    db: str | None,
    key_file: str | None,
    as_json: bool,
    status: str | None,
    workflow: str | None,
    limit: int | None,
) -> None:
    """The tasks of the store, oldest first: id, title, status, retries, workflow, lease holder and when
    its lease expires. Its commands act on one task (requeue, cancel)."""
    if ctx.invoked_subcommand is not None:
        return
    url, keys = store_url(db), store_keys(key_file)
    found = run(_tasks(url, keys, status, workflow, limit), f"cannot list the tasks of {redact_url(url)}")
    out = listing_console(found, as_json, "no tasks" + (f" with status {status}" if status else ""))
    if out is None:
        return
    table = Table(show_edge=False)
    table.add_column("task", no_wrap=True)  # ids are copied whole into other commands
    for column in ("title", "status", "retries"):
        table.add_column(column)
    table.add_column("workflow", overflow="fold")
    for column in ("lease holder", "lease expires"):
        table.add_column(column)
    for t in found:
        table.add_row(
            t.id,
            escape(t.title),
            t.status,
            f"{t.retry_count}/{t.max_retries}",
            t.workflow_id or "",
            escape(t.lease_owner or ""),
            _when(t.lease_expires_at),
        )
    out.print(table)
    out.print(counted(len(found), "task"))


async def _trace(url: str, keys: Keys | None, trace_id: str) -> list[Span]:
    async with open_for_reading(url, keys) as store:
        return await store.traces.get(trace_id)


@main.command()
@store_options
@json_option
@click.argument("trace_id")
def trace(db: str | None, key_file: str | None, as_json: bool, trace_id: str) -> None:
    """The spans of TRACE_ID as a tree: each under its parent, in start order, with its kind, status and
    duration ("open" for a span that has not ended).

    Exits 1 if the trace has no span.
    """
    url, keys = store_url(db), store_keys(key_file)
    spans = run(_trace(url, keys, trace_id), f"cannot read trace {trace_id!r}")
    if not spans:
        raise Failure(f"there is no span of trace {trace_id!r} in {redact_url(url)}")
    if as_json:
        echo_json(spans)
        return
    out = console()
    view = waterfall(spans)
    out.print(f"[bold]trace {escape(trace_id)}[/bold] — {counted(len(spans), 'span')}, {view.total}")
    for bar in view.bars:
        span = bar.span
        status = {"error": "[red]error[/red]", "ok": "[green]ok[/green]"}.get(span.status, span.status)
        note = " [yellow](parent span not recorded)[/yellow]" if bar.orphan else ""
        out.print(
            f"{'  ' * bar.depth}{'└─ ' if bar.depth else ''}[bold]{escape(span.name)}[/bold] "
            f"[dim]{escape(span.kind)}[/dim] {status} {bar.duration}{note}"
        )
