"""``statekeel status``, ``doctor`` and ``info``: what a store holds and whether it is healthy.

``status`` is quick (``Store.info(check_integrity=False)``); ``doctor`` runs every health check
(``Store.health()``) and says what to do; ``info`` shows both. None of them changes the store.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..health import PROBLEM, HealthReport, StoreInfo
from ..store import redact_url
from ..wording import counted
from .common import (
    Keys,
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


def _by_status(name: str, counts: dict[str, int]) -> str:
    detail = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()) if n)
    return f"{name}: {sum(counts.values())}" + (f" ({detail})" if detail else "")


def _print_facts(out: Console, facts: StoreInfo, *, migrations: bool) -> None:
    out.print(f"[bold]{escape(facts.url)}[/bold] — schema version {facts.schema_version}")
    if migrations:
        table = Table(show_edge=False)
        for column in ("version", "migration", "applied at"):
            table.add_column(column)
        for m in facts.migrations:
            table.add_row(str(m.version), m.name, m.applied_at.isoformat())
        out.print(table)
    for version, name in facts.pending_migrations:
        out.print(f"[yellow]pending migration[/yellow] {version} {escape(name)}")
    counts = facts.counts
    if counts is None:
        out.print("state counts: unavailable (see the integrity check)")
    else:
        # A kind the store does not hold has no count: "not held", since a 0 would say it holds none.
        def held(kind: str, text: str, name: str) -> str:
            return f"{name}: not held" if kind in facts.not_held else text

        out.print(held("sessions", _by_status("sessions", counts.sessions), "sessions"), markup=False)
        out.print(held("tasks", _by_status("tasks", counts.tasks), "tasks"), markup=False)
        out.print(held("workflows", _by_status("workflows", counts.workflows), "workflows"), markup=False)
        out.print(held("approvals", f"approvals pending: {counts.approvals_pending}", "approvals"))
        out.print(held("audit", f"audit entries: {counts.audit_entries}", "audit entries"))
        memories = f"memories: {counts.memories}, open contradictions: {counts.contradictions_open}"
        files = f"file changes: {counts.file_changes}"
        out.print(f"{held('memory', memories, 'memories')}, {held('files', files, 'file changes')}")
        threads = f"langgraph threads: {counts.checkpoint_threads}, checkpoints: {counts.checkpoints}"
        out.print(held("checkpoints", threads, "langgraph threads"))
    if facts.files is not None:
        out.print(
            f"database file: {size_text(facts.files.database_bytes)}, WAL: {size_text(facts.files.wal_bytes)}"
        )
    where = f" in {escape(facts.fallback_dir)}" if facts.fallback_dir else ""
    colour = "yellow" if facts.fallback_files else "default"
    out.print(f"[{colour}]fallback files waiting for replay: {facts.fallback_files}[/{colour}]{where}")


# StateCounts' fields by the kind each counts.
_COUNT_FIELDS = {
    "sessions": ("sessions",),
    "tasks": ("tasks",),
    "workflows": ("workflows",),
    "approvals": ("approvals_pending",),
    "audit": ("audit_entries",),
    "memory": ("memories", "contradictions_open"),
    "files": ("file_changes",),
    "checkpoints": ("checkpoint_threads", "checkpoints"),
}


def _facts_json(facts: StoreInfo) -> dict[str, Any]:
    """``status --json``: the facts, a kind the store does not hold counted as null (listed in
    ``not_held``), never as 0."""
    plain = {f.name: getattr(facts, f.name) for f in dataclasses.fields(facts)}
    if facts.counts is not None:
        counts = {f.name: getattr(facts.counts, f.name) for f in dataclasses.fields(facts.counts)}
        for kind in facts.not_held:
            for name in _COUNT_FIELDS[kind]:
                counts[name] = None
        plain["counts"] = counts
    return plain


def _print_health(out: Console, report: HealthReport) -> None:
    failed = {f.check for f in report.problems}
    for check in report.checks:
        if check not in failed:
            out.print(f"[green]ok[/green]      {check}")
    for f in report.findings:
        tag = "[red]PROBLEM[/red]" if f.severity == PROBLEM else "[yellow]notice[/yellow] "
        out.print(f"{tag} {escape(f.check)}: {escape(f.detail)}")
        out.print(f"        → {escape(f.advice)}")
    if report.info.integrity == ():
        out.print("integrity check: ok")
    if report.ok:
        out.print("[green]no problems found[/green]")
    else:
        out.print(f"[red]{counted(len(report.problems), 'problem')} found[/red]")


def _health_json(report: HealthReport) -> dict[str, Any]:
    return {
        "ok": report.ok,
        "checks": list(report.checks),
        "findings": list(report.findings),
        "recovery": report.recovery.summary(),
    }


async def _status(url: str, keys: Keys | None) -> StoreInfo:
    async with open_for_reading(url, keys) as store:
        return await store.info(check_integrity=False)


async def _health(url: str, keys: Keys | None, files_root: str | None) -> HealthReport:
    async with open_for_reading(url, keys) as store:
        return await store.health(files_root=files_root)


files_root_option = click.option(
    "--files-root",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Also compare the file ledger with the files under this directory (drift).",
)


@main.command()
@store_options
@json_option
def status(db: str | None, key_file: str | None, as_json: bool) -> None:
    """Schema version, state counts per kind, database and WAL sizes, and fallback files waiting for replay.

    Quick: no integrity check (see doctor). Never changes the store.
    """
    url, keys = store_url(db), store_keys(key_file)
    facts = run(_status(url, keys), f"cannot read {redact_url(url)}")
    if as_json:
        echo_json(_facts_json(facts))
        return
    _print_facts(console(), facts, migrations=False)


@main.command()
@store_options
@json_option
@files_root_option
@click.pass_context
def doctor(
    ctx: click.Context, db: str | None, key_file: str | None, as_json: bool, files_root: str | None
) -> None:
    """Run every health check — integrity, schema, fallback files, incidents, audit chain, tool calls
    without a result, expired leases, steps in doubt, file drift — and say what to do about each problem.

    Exits 1 if any check finds a problem. Never changes the store (recover repairs what it can).
    """
    url, keys = store_url(db), store_keys(key_file)
    report = run(_health(url, keys, files_root), f"cannot check {redact_url(url)}")
    if as_json:
        echo_json(_health_json(report))
    else:
        _print_health(console(), report)
    ctx.exit(0 if report.ok else 1)


@main.command()
@store_options
@json_option
@files_root_option
@click.pass_context
def info(
    ctx: click.Context, db: str | None, key_file: str | None, as_json: bool, files_root: str | None
) -> None:
    """Schema version, applied migrations, state counts and files of the store, then every health check
    of doctor.

    Exits 1 if the store cannot be opened or any check finds a problem. Never changes the store.
    """
    url, keys = store_url(db), store_keys(key_file)
    report = run(_health(url, keys, files_root), f"cannot open {redact_url(url)}")
    if as_json:
        echo_json({"info": report.info, **_health_json(report)})
    else:
        out = console()
        _print_facts(out, report.info, migrations=True)
        _print_health(out, report)
    ctx.exit(0 if report.ok else 1)
