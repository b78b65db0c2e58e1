"""``statekeel export`` and ``statekeel import``: a store to one JSONL file and back
(``statekeel.export_store`` / ``statekeel.import_store``), with a progress bar on a terminal."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..backup import discard_files
from ..export import KIND_GROUPS, ExportReport, export_store
from ..imports import ImportReport, import_store
from ..store import open_store, redact_url, sqlite_file
from ..wording import counted
from .common import (
    Keys,
    command_audit_key,
    command_keyring,
    console,
    echo_json,
    json_option,
    open_for_reading,
    run,
    size_text,
    store_keys,
    store_options,
    store_url,
)
from .group import main


@contextmanager
def _progress() -> Iterator[Callable[[str, int], None] | None]:
    """A progress display on stderr when it is a terminal (records per kind), else nothing."""
    if not sys.stderr.isatty():
        yield None
        return
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description:<24}"),
        TextColumn("{task.completed} records"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        tasks: dict[str, Any] = {}

        def on_batch(kind: str, done: int) -> None:
            if kind not in tasks:
                tasks[kind] = progress.add_task(kind, total=None)
            progress.update(tasks[kind], completed=done)

        yield on_batch


def _counts_table(counts: dict[str, int]) -> Table:
    table = Table(show_edge=False)
    table.add_column("kind")
    table.add_column("records", justify="right")
    for kind, n in counts.items():
        if n:
            table.add_row(kind, str(n))
    return table


async def _export(
    url: str, keys: Keys | None, path: str, sessions: list[str] | None, kinds: list[str] | None, force: bool
) -> ExportReport:
    async with open_for_reading(url, keys) as store:
        with _progress() as on_batch:
            return await export_store(
                store, path, sessions=sessions, kinds=kinds, overwrite=force, on_batch=on_batch
            )


@main.command("export")
@store_options
@json_option
@click.argument("path", type=click.Path(dir_okay=False))
@click.option(
    "--session",
    "sessions",
    multiple=True,
    metavar="KEY",
    help="Export only this session's records (repeat for several).",
)
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    metavar="KIND",
    help=f"Export only this kind (repeat for several): {', '.join(KIND_GROUPS)}, or a table name.",
)
@click.option("--force", is_flag=True, help="Replace PATH if it exists.")
def export_command(
    db: str | None,
    key_file: str | None,
    as_json: bool,
    path: str,
    sessions: tuple[str, ...],
    kinds: tuple[str, ...],
    force: bool,
) -> None:
    """Write the store's state to the new JSONL file PATH (export_store): a header line (format, schema
    version, counts, SHA-256 of the body), then one record a line; owner-only (0600).

    PATH must not exist unless --force. The file appears only once complete: an interrupted export
    leaves nothing at PATH. Encrypted values stay sealed (no key is needed to export). The format is in
    docs/export-format.md.
    """
    url, keys = store_url(db), store_keys(key_file)
    report = run(
        _export(url, keys, path, list(sessions) or None, list(kinds) or None, force),
        f"cannot export {redact_url(url)}",
    )
    if as_json:
        echo_json(report)
        return
    out = console()
    out.print(_counts_table(report.counts))
    out.print(
        f"exported {counted(report.records, 'record')} of {redact_url(url)} to {report.path} "
        f"({size_text(report.bytes)}, sha256 {report.sha256[:16]}…) in {report.seconds:.2f} s",
        markup=False,
    )


async def _import(url: str, keys: Keys | None, path: str) -> ImportReport:
    async with open_store(
        url, encryption_key=keys, audit_key=command_audit_key(), keyring=command_keyring(keys)
    ) as store:
        with _progress() as on_batch:
            return await import_store(store, path, on_batch=on_batch)


def import_export_file(url: str, keys: Keys | None, as_json: bool, file: str) -> None:
    """``statekeel import FILE`` (``cli/importing.py`` owns the command): load a statekeel export into the
    store, which is created or migrated if needed, and print what went in."""
    path = sqlite_file(url)
    created = path if path is not None and not os.path.lexists(path) else None
    try:
        report = run(_import(url, keys, file), f"cannot import {file} into {redact_url(url)}")
    except BaseException:
        # A refused import leaves no new, empty store behind.
        if created is not None:
            discard_files(created)
        raise
    if as_json:
        echo_json(report)
        return
    out = console()
    out.print(_counts_table(report.counts))
    out.print(
        f"imported {counted(report.records, 'record')} from {report.path} into {redact_url(url)} in "
        f"{report.seconds:.2f} s; counts and sha256 verified",
        markup=False,
    )
