"""``statekeel sessions`` and ``statekeel show SESSION``: the sessions of a store and one transcript.

``show`` pairs each tool call with its result the way :mod:`statekeel.transcripts` does (through the
ui's transcript view, which needs none of the ui extra) and marks the parts compression moved to the
archive. Both only read: a session is read with ``sessions.snapshot()``, never repaired or cached.
"""

from __future__ import annotations

import asyncio
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from ..backends.base import SESSION_STATUSES, LoadedSession, SessionRecord
from ..store import redact_url
from ..ui.transcript import Entry, Fold, Part, ToolCall, build_transcript, compact, pretty
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


async def _sessions(
    url: str, keys: Keys | None, status: str | None, limit: int | None
) -> list[SessionRecord]:
    async with open_for_reading(url, keys) as store:
        return await collect(store.sessions.iter(status=status), limit)


@main.command()
@store_options
@json_option
@click.option(
    "--status", type=click.Choice(SESSION_STATUSES), default=None, help="Only sessions in this status."
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="At most this many (newest first). Default: all.",
)
@click.option("--tree", is_flag=True, help="Show forks under the session they were forked from.")
def sessions(
    db: str | None, key_file: str | None, as_json: bool, status: str | None, limit: int | None, tree: bool
) -> None:
    """The sessions of the store, most recently updated first: key, status, messages, open tool calls.
    With --tree, each fork is shown under its parent with the seq it forked at."""
    url, keys = store_url(db), store_keys(key_file)
    found = run(_sessions(url, keys, status, limit), f"cannot list the sessions of {redact_url(url)}")
    out = listing_console(found, as_json, "no sessions" + (f" with status {status}" if status else ""))
    if out is None:
        return
    if tree:
        out.print(_tree(found))
        out.print(counted(len(found), "session"))
        return
    table = Table(show_edge=False)
    table.add_column("session", overflow="fold")  # keys are what show takes: never cut
    for column in ("status", "messages", "archived", "open calls", "updated at"):
        table.add_column(column)
    for r in found:
        calls = "?" if r.open_calls < 0 else str(r.open_calls)
        table.add_row(
            escape(r.key),
            r.status,
            str(r.head_seq),
            str(r.last_consolidated),
            calls,
            r.updated_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    out.print(table)
    out.print(counted(len(found), "session"))


def _tree(found: list[SessionRecord]) -> Tree:
    """The sessions as a forest: each fork under its parent (a fork whose parent is not listed is a root)."""
    listed = {r.key for r in found}
    children: dict[str | None, list[SessionRecord]] = {}
    for r in found:
        parent = r.parent_key if r.parent_key in listed else None
        children.setdefault(parent, []).append(r)
    root = Tree("[bold]sessions[/bold]", guide_style="dim")

    def add(node: Tree, record: SessionRecord) -> None:
        forked = (
            ""
            if record.parent_key is None
            else f", forked from {escape(record.parent_key)} at #{record.parent_seq}"
        )
        branch = node.add(
            f"{escape(record.key)} [dim]({record.status}, "
            f"{counted(record.head_seq, 'message')}{forked})[/dim]"
        )
        for child in sorted(children.get(record.key, []), key=lambda c: (c.parent_seq or 0, c.key)):
            add(branch, child)

    for record in children.get(None, []):
        add(root, record)
    return root


async def _load(url: str, keys: Keys | None, key: str) -> tuple[LoadedSession | None, bool]:
    async with open_for_reading(url, keys) as store:
        loaded = await store.sessions.snapshot(key)
        fallback = store.sessions.fallback
        waiting = fallback is not None and await asyncio.to_thread(fallback.exists, key)
        return loaded, waiting


def _shown(value: Any, limit: int = 300) -> str:
    """A result or argument on one line: text as it is, anything else as compact JSON."""
    if isinstance(value, str):
        line = " ".join(value.split())
        return escape(line if len(line) <= limit else line[: limit - 1] + "…")
    return escape(compact(value, limit))


def _print_call(out: Console, call: ToolCall, indent: str) -> None:
    call_id = escape(call.call_id or "no id")
    name, arguments = escape(call.name), _shown(call.arguments)
    out.print(f"{indent}[cyan]→ tool call[/cyan] {name} {arguments} [dim]({call_id})[/dim]")
    result = call.result
    if result is not None:
        tag = "[red]error[/red] " if result.is_error else ""
        if result.interrupted:
            tag = "[yellow]interrupted[/yellow] "
        out.print(f"{indent}  [green]← result[/green] {tag}#{result.seq}: {_shown(result.content)}")
    elif call.state == "pending":
        out.print(f"{indent}  [yellow]… no result yet (the agent may still answer it)[/yellow]")
    elif call.state == "dangling":
        out.print(f"{indent}  [red]✗ no result, and the transcript moved on[/red] (see: statekeel doctor)")


def _print_part(out: Console, part: Part, indent: str) -> None:
    if part.kind == "text":
        label = f"[dim]{escape(part.label)}:[/dim] " if part.label else ""
        out.print(f"{indent}{label}{escape(part.text)}")
    elif part.kind == "thinking":
        out.print(f"{indent}[dim italic]thinking: {escape(part.text)}[/dim italic]")
    elif part.kind == "json":
        label = f"{escape(part.label)}: " if part.label else ""
        out.print(f"{indent}[dim]{label}{escape(pretty(part.value))}[/dim]")
    elif part.kind == "call" and part.call is not None:
        _print_call(out, part.call, indent)
    elif part.kind == "result" and part.result is not None:
        result = part.result
        if result.call is not None:
            call_id = escape(result.call_id or "")
            out.print(f"{indent}[dim]result of {call_id}, shown under #{result.call.seq}[/dim]")
        else:
            why = escape(result.problem or "it answers no call")
            out.print(f"{indent}[red]← orphan result[/red] ({why}): {_shown(result.content)}")


def _print_entry(out: Console, entry: Entry, archived: bool) -> None:
    indent = "    " if archived else "  "
    mark = " [magenta]\\[archived][/magenta]" if archived else ""
    out.print(f"{indent[:-2]}[bold]#{entry.seq} {escape(entry.role)}[/bold]{mark}")
    for part in entry.parts:
        _print_part(out, part, indent)
    if entry.fields:
        out.print(f"{indent}[dim]other fields: {escape(compact(entry.fields, 300))}[/dim]")


def _print_transcript(out: Console, loaded: LoadedSession, waiting: bool) -> None:
    record = loaded.record
    view = build_transcript(loaded.messages, first_seq=loaded.first_seq, summaries=loaded.summaries)
    out.print(
        f"[bold]session {escape(record.key)}[/bold] — {record.status}, "
        f"{counted(record.head_seq, 'message')}, "
        f"{record.last_consolidated} archived, {counted(view.calls, 'tool call')}, "
        f"updated {record.updated_at.isoformat(timespec='seconds')}"
    )
    if waiting:
        out.print("[yellow]a fallback file of this session waits for replay (statekeel recover)[/yellow]")
    fork_at = record.parent_seq if record.parent_key is not None else None
    if fork_at is not None:
        out.print(f"[blue]a fork of {escape(str(record.parent_key))} at #{fork_at}[/blue]")

    def fork_point(at: int) -> None:
        out.print(
            f"[blue]── fork point: #0 to #{at - 1} are {escape(str(record.parent_key))}'s, "
            f"#{at} on this fork's own ──[/blue]"
            if at
            else "[blue]── fork point: every message is this fork's own ──[/blue]"
        )

    for item in view.items:
        if fork_at is not None and isinstance(item, Entry) and item.seq >= fork_at:
            fork_point(fork_at)
            fork_at = None
        if isinstance(item, Fold):
            out.print(
                f"[magenta]── archived #{item.first_seq} to #{item.upto_seq - 1} (compression "
                f"{escape(item.compression_id)}), summary:[/magenta] {escape(item.summary)}"
            )
            for entry in item.entries:
                _print_entry(out, entry, archived=True)
            out.print("[magenta]── end of archived part[/magenta]")
        else:
            _print_entry(out, item, archived=False)
    if fork_at is not None:
        fork_point(fork_at)  # nothing of its own yet
    if view.dangling:
        out.print(f"[red]{counted(len(view.dangling), 'tool call')} without a result[/red]")
    if view.orphans:
        out.print(
            f"[red]{counted(len(view.orphans), 'result')} that answer"
            + ("s no call where it is" if len(view.orphans) == 1 else " no call where they are")
            + "[/red]"
        )


def _as_json(loaded: LoadedSession, waiting: bool) -> dict[str, Any]:
    return {
        "session": loaded.record,
        "fallback_waiting": waiting,
        "messages": [{"seq": loaded.first_seq + i, "message": m} for i, m in enumerate(loaded.messages)],
        "archived": [
            {"compression_id": c, "first_seq": first, "upto_seq": upto, "summary": summary}
            for c, first, upto, summary in loaded.summaries
        ],
    }


@main.command()
@store_options
@json_option
@click.argument("session")
def show(db: str | None, key_file: str | None, as_json: bool, session: str) -> None:
    """The transcript of SESSION: every message in order, each tool call with its result under it, calls
    left without a result marked, and the messages compression archived shown under their summary.

    Exits 1 if there is no such session.
    """
    url, keys = store_url(db), store_keys(key_file)
    loaded, waiting = run(_load(url, keys, session), f"cannot read session {session!r}")
    if loaded is None:
        raise Failure(f"there is no session {session!r} in {redact_url(url)} (statekeel sessions lists them)")
    if as_json:
        echo_json(_as_json(loaded, waiting))
    else:
        _print_transcript(console(), loaded, waiting)
