"""``statekeel import``: bring existing state into a store.

``statekeel import --from openai-agents-sqlite PATH [--session ID]`` and ``--from langgraph-sqlite PATH``
copy the database another framework's own store wrote (``statekeel.integrations.importers``); a plain
``statekeel import FILE`` loads a statekeel export (``statekeel.import_store``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..store import open_store, redact_url
from ..wording import counted
from . import main
from .common import (
    command_audit_key,
    command_keyring,
    console,
    echo_json,
    json_option,
    run,
    store_keys,
    store_options,
    store_url,
)
from .export import import_export_file

SOURCES = ("openai-agents-sqlite", "langgraph-sqlite")


async def _from_source(
    url: str, keys: Any, source: str, path: str, session_id: str | None, show: bool
) -> Any:
    from ..integrations.importers import import_from

    async with open_store(
        url, encryption_key=keys, audit_key=command_audit_key(), keyring=command_keyring(keys)
    ) as store:
        if not show:
            return await import_from(store, source, path, session_id=session_id)
        with Progress(
            TextColumn("{task.description:<24}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console(),
        ) as bar:
            task = bar.add_task("sessions" if source.startswith("openai") else "checkpoints", total=None)

            def tick(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            return await import_from(store, source, path, session_id=session_id, progress=tick)


@main.command("import")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option(
    "--from",
    "source",
    type=click.Choice(SOURCES),
    default=None,
    help="The store that wrote PATH: the Agents SDK's SQLiteSession or LangGraph's SqliteSaver database.",
)
@click.option("--session", "session_id", default=None, metavar="ID", help="Import this SDK session only.")
@store_options
@json_option
def import_(
    path: str,
    source: str | None,
    session_id: str | None,
    db: str | None,
    key_file: str | None,
    as_json: bool,
) -> None:
    """Import PATH into the store: without --from, a statekeel export file (import_store); with --from,
    the database an OpenAI Agents SDK SQLiteSession or a LangGraph SqliteSaver wrote (its sessions or
    checkpoints, counts checked; run it again to pick up what was added since).

    The source is checked whole first: a truncated, edited or newer export file, or a database of the
    wrong shape, writes nothing. An export's records then go in one transaction: all of it or none (a
    record whose key the store holds already refuses the import). Audit entries keep their hashes, so
    they go only into a store whose audit log is empty.
    """
    url, keys = store_url(db), store_keys(key_file)
    if source is None:
        if session_id is not None:
            raise click.UsageError("--session applies to --from openai-agents-sqlite")
        import_export_file(url, keys, as_json, path)
        return
    if not os.path.isfile(path):
        raise click.BadParameter(f"{path} is not a file", param_hint="PATH")
    if session_id is not None and source != "openai-agents-sqlite":
        raise click.UsageError("--session applies to --from openai-agents-sqlite")
    show = sys.stdout.isatty()
    report = run(
        _from_source(url, keys, source, path, session_id, show),
        f"cannot import {path} into {redact_url(url)}",
    )
    if as_json:
        echo_json(report)
        return
    what = ("session", "item") if source == "openai-agents-sqlite" else ("thread", "checkpoint")
    line = (
        f"imported {counted(report.units, what[0])}, {counted(report.records, what[1])} from {path} into "
        f"{redact_url(url)}: "
        f"{report.added} added, {report.skipped} already there"
    )
    if source == "langgraph-sqlite":
        line += f", {counted(report.writes, 'pending write')}"
    out = console()
    out.print(line, markup=False)
    for s in report.sessions:  # what was done with each session
        if s.outcome == "imported":
            said = f"imported {counted(s.added, 'new item')} after the {s.held} the store held"
        elif s.outcome == "skipped":
            said = f"skipped: the store holds all {s.held} of its items"
        else:
            said = f"conflict: {s.reason}"
        out.print(f"session {s.key}: {said}", markup=False)
    if report.sessions and any(s.outcome == "conflict" for s in report.sessions):
        raise SystemExit(1)


__all__ = ["import_"]
