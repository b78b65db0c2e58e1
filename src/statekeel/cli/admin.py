"""The commands that look after a store: ``recover``, ``audit verify``, ``migrate``, ``backup``, ``copy``,
``gc`` and ``rotate-key``. Each is one library call (``Store.recover``, ``AuditLog.verify``,
``open_store``, ``Store.backup``, ``copy_store``, ``Store.purge``, ``Store.rotate_encryption_key``) with
its outcome printed.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..audit import AuditVerification
from ..backup import BackupReport, discard_files
from ..codec.encryption import RotationReport
from ..copy import CopyReport
from ..copying import copy_store
from ..errors import ConflictError, MigrationError
from ..recovery import RecoveryReport
from ..retention import PurgeReport, Retention
from ..store import open_store, redact_url, sqlite_file
from ..wording import counted
from .common import (
    KEY_FILE_ENV,
    F,
    Failure,
    Keys,
    command_audit_key,
    command_keyring,
    console,
    echo_json,
    json_option,
    open_for_reading,
    require_existing,
    run,
    size_text,
    store_keys,
    store_options,
    store_url,
)
from .group import main
from .operate import settle_commands

# What recover() reports, by what it means: found and repaired (or to repair), needs a person, for
# information. The names are RecoveryReport.summary() keys.
_REPAIRED = (
    ("fallback_replayed", "fallback file replayed into the store", "fallback files replayed into the store"),
    (
        "orphaned_tool_calls",
        "tool call answered with an 'interrupted' result",
        "tool calls answered with an 'interrupted' result",
    ),
    (
        "interrupted_tasks",
        "running task with an expired lease marked interrupted",
        "running tasks with an expired lease marked interrupted",
    ),
    ("indexes_rebuilt", "damaged index rebuilt", "damaged indexes rebuilt"),
)
_ATTENTION = (
    ("integrity_problems", "integrity problem", "integrity problems"),
    ("damaged_tables", "damaged table", "damaged tables"),
    ("unreadable_rows", "unreadable row", "unreadable rows"),
    ("incidents", "unacknowledged incident", "unacknowledged incidents"),
    (
        "fallback_left",
        "fallback file that could not be replayed",
        "fallback files that could not be replayed",
    ),
    ("sessions_failed", "session that could not be checked", "sessions that could not be checked"),
    ("steps_in_doubt", "task step in doubt", "task steps in doubt"),
    ("tool_calls_in_doubt", "tool call in doubt", "tool calls in doubt"),
    ("drifted_files", "file changed on disk since recorded", "files changed on disk since recorded"),
    ("skipped", "recovery step skipped over damage", "recovery steps skipped over damage"),
    (
        "audit_key_needed",
        "repair refused: the audit chain is keyed and no audit key was given",
        "repairs refused: the audit chain is keyed and no audit key was given",
    ),
)
_INFO = (
    (
        "sessions_busy",
        "session held by a live agent (left alone)",
        "sessions held by a live agent (left alone)",
    ),
    ("pending_approvals", "approval waiting for a decision", "approvals waiting for a decision"),
    ("unfinished_workflows", "unfinished workflow", "unfinished workflows"),
    ("open_contradictions", "open memory contradiction", "open memory contradictions"),
    ("lagging_vectors", "source whose vectors lag", "sources whose vectors lag"),
    ("traces_dropped", "trace span dropped by a full buffer", "trace spans dropped by a full buffer"),
)


async def _recover(url: str, keys: Keys | None, dry_run: bool, files_root: str | None) -> RecoveryReport:
    async with open_for_reading(url, keys) as store:
        return await store.recover(repair=not dry_run, files_root=files_root)


@main.command()
@store_options
@json_option
@click.option("--dry-run", is_flag=True, help="Report what would be repaired; write nothing.")
@click.option(
    "--files-root",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Also compare the file ledger with the files under this directory.",
)
@click.pass_context
def recover(
    ctx: click.Context,
    db: str | None,
    key_file: str | None,
    as_json: bool,
    dry_run: bool,
    files_root: str | None,
) -> None:
    """Restore the meaning of the store after a crash (store.recover()): replay fallback files, answer
    tool calls left without a result, mark tasks with an expired lease interrupted, rebuild damaged
    indexes; report what needs a person. Running it again finds nothing more to repair.

    Exits 1 if something needs a person (damage, incidents, a failing audit chain, steps or tool calls
    in doubt, files changed on disk, a repair the store refused without its audit key), with --dry-run
    too. Each finding is listed by name: sessions and call ids, tasks, steps, approvals; each that a
    person decides (a step or tool call in doubt, a pending approval, an interrupted task) with the
    commands that settle it (--json: "settle").
    """
    url, keys = store_url(db), store_keys(key_file)
    report = run(_recover(url, keys, dry_run, files_root), f"cannot recover {redact_url(url)}")
    summary = report.summary()
    code = 1 if report.needs_attention else 0
    if as_json:
        echo_json(
            {
                "ok": report.ok,
                "needs_attention": report.needs_attention,
                "dry_run": dry_run,
                "summary": summary,
                "details": report.details(),
                "settle": settle_commands(report, url),
                "advice": report.advice,
            }
        )
        ctx.exit(code)
    out = console()
    out.print(f"schema version {report.schema_version}" + (" — dry run: nothing written" if dry_run else ""))
    names = _names(report)
    repaired = [(key, n, one, many) for key, one, many in _REPAIRED if (n := summary[key])]
    if repaired:
        verb = "would repair" if dry_run else "repaired"
        for key, n, one, many in repaired:
            out.print(f"[green]{verb}[/green] {counted(n, one, many)}")
            _print_names(out, names.get(key, []))
    else:
        out.print("nothing to repair")
    for key, one, many in _ATTENTION:
        if summary[key]:
            out.print(f"[red]needs attention[/red] {counted(summary[key], one, many)}")
            _print_names(out, names.get(key, []))
    if summary["audit_ok"] is False:
        out.print("[red]needs attention[/red] the audit chain does not verify (statekeel audit verify)")
    for key, one, many in _INFO:
        if summary[key]:
            out.print(f"[dim]note[/dim] {counted(summary[key], one, many)}")
            _print_names(out, names.get(key, []))
    settle = settle_commands(report, url)
    if settle:
        out.print("to settle what needs a person, one command each (JSON, TEXT: the value you decide):")
    for item in settle:
        out.print(f"  {item['item']}:", markup=False)
        for command in item["commands"]:
            out.print(f"    {command}", markup=False, soft_wrap=True)  # one line, to copy whole
    for advice in report.advice:
        out.print(f"→ {advice}", markup=False)
    if summary["sessions_failed"] and keys is None:
        out.print(
            "→ sessions that could not be checked: `statekeel show KEY` says why; an encrypted store needs "
            "its keys (--key-file PATH)",
            markup=False,
        )
    ctx.exit(code)


def _when(value: dt.datetime | None) -> str:
    return "never" if value is None else value.isoformat(timespec="seconds")


def _lease_expired(at: dt.datetime | None) -> str:
    # A task recovery moved had a lease that expired: with its time when known, never "never".
    return "its lease expired" if at is None else f"its lease expired at {_when(at)}"


def _names(report: RecoveryReport) -> dict[str, list[str]]:
    """The lines under each count of the recover command: what it counts, by name."""
    fallback = report.fallback
    return {
        "fallback_replayed": []
        if fallback is None
        else [f"session {key}: {counted(n, 'message')}" for key, n in sorted(fallback.replayed.items())],
        "fallback_left": []
        if fallback is None
        else [f"{what}: {why}" for what, why in sorted({**fallback.failed, **fallback.quarantined}.items())]
        + [f"session {key}: held by this process" for key in fallback.skipped],
        "orphaned_tool_calls": [
            f"session {key}: {', '.join(ids)}" for key, ids in sorted(report.orphaned_tool_calls.items())
        ],
        "interrupted_tasks": [
            f"task {t.id} ({t.title}): held by {t.lease_owner or 'nobody'} at epoch {t.lease_epoch}, "
            + _lease_expired(report.lease_expired_at.get(t.id, t.lease_expires_at))
            for t in report.interrupted_tasks
        ],
        "indexes_rebuilt": list(report.indexes_rebuilt),
        "integrity_problems": list(report.integrity_problems),
        "damaged_tables": [
            f"{d.table}: "
            + ("index only" if d.index_only else f"{counted(len(d.unreadable), 'unreadable row')}")
            for d in report.damage
        ],
        "incidents": [f"incident {i.id} ({i.kind}), {_when(i.detected_at)}" for i in report.incidents],
        "sessions_failed": [f"session {key}: {why}" for key, why in sorted(report.sessions_failed.items())],
        "steps_in_doubt": [
            f"task {s.task_id} step {s.step_key} (attempt {s.attempt}, started {_when(s.started_at)})"
            for s in report.steps_in_doubt
        ],
        "tool_calls_in_doubt": [
            f"session {c.session_key} call {c.call_id} (attempt {c.attempt}, started {_when(c.started_at)})"
            for c in report.tool_calls_in_doubt
        ],
        "drifted_files": [f"{d.path} ({d.kind})" for d in report.drifted_files],
        "skipped": [f"{step}: {why}" for step, why in sorted(report.skipped.items())],
        "audit_key_needed": [f"{step}: {why}" for step, why in sorted(report.audit_key_needed.items())],
        "sessions_busy": [f"session {key}" for key in report.sessions_busy],
        "pending_approvals": [
            f"approval {a.id}: {a.action} on {a.subject}, requested by {a.requested_by} "
            f"{_when(a.requested_at)}"
            for a in report.pending_approvals
        ],
        "unfinished_workflows": [
            f"workflow {w.id} ({w.name}): {w.status}" for w in report.unfinished_workflows
        ],
    }


def _print_names(out: Console, names: list[str]) -> None:
    for name in names:
        out.print(f"    {name}", markup=False)


@main.group()
def audit() -> None:
    """The tamper-evident audit log."""


async def _verify(url: str, keys: Keys | None) -> AuditVerification:
    async with open_for_reading(url, keys) as store:
        return await store.audit.verify()


@audit.command("verify")
@store_options
@json_option
@click.pass_context
def audit_verify(ctx: click.Context, db: str | None, key_file: str | None, as_json: bool) -> None:
    """Check the hash chain of every audit entry and the approvals recorded with them (audit.verify()).

    Exits 1 if an entry was changed, removed or inserted outside statekeel.
    """
    url, keys = store_url(db), store_keys(key_file)
    result = run(_verify(url, keys), f"cannot verify the audit log of {redact_url(url)}")
    if as_json:
        echo_json(result)
    elif result.ok:
        authenticated = f", {result.authenticated} authenticated" if result.authenticated else ""
        console().print(
            f"[green]audit chain ok[/green]: {counted(result.count, 'entry')}{authenticated}, "
            f"{counted(result.approvals, 'approval')} checked"
        )
    else:
        console().print(
            f"[red]audit chain broken at entry {result.first_bad_seq}[/red]: {escape(result.reason or '')}"
        )
        console().print(
            "→ treat the audit entries and approvals as untrusted and find out who changed the database",
            markup=False,
        )
    ctx.exit(0 if result.ok else 1)


async def _schema_version(url: str, keys: Keys | None) -> tuple[int, list[int]]:
    """The schema version of the store at ``url`` and the migrations it lacks, changing nothing."""
    try:
        async with open_for_reading(url, keys) as store:
            return (await store.info(check_integrity=False)).schema_version, []
    except MigrationError as exc:
        pending = getattr(exc, "pending", None)
        if pending is None:
            raise
        return int(getattr(exc, "version", 0)), list(pending)


async def _migrate(url: str, keys: Keys | None) -> int:
    async with open_store(
        url, encryption_key=keys, audit_key=command_audit_key(), keyring=command_keyring(keys)
    ) as store:
        return (await store.info(check_integrity=False)).schema_version


def _new_file(url: str) -> str | None:
    """Why the SQLite file of ``url`` holds no store yet (missing, or empty), or None."""
    path = sqlite_file(url)
    if path is None:
        return None
    if not os.path.exists(path):
        return f"no store at {path}: the file does not exist"
    return f"no store at {path}: the file is empty" if os.path.getsize(path) == 0 else None


@main.command()
@store_options
@json_option
@click.option("--check", is_flag=True, help="Only say whether migrations are pending (exit 1 if so).")
@click.option("--create", is_flag=True, help="Create the store if the SQLite file does not exist.")
@click.pass_context
def migrate(
    ctx: click.Context, db: str | None, key_file: str | None, as_json: bool, check: bool, create: bool
) -> None:
    """Upgrade the store's schema to this statekeel's version. Each migration commits with its record;
    a SQLite file is backed up next to itself first. Stop the agents of older versions first: they will
    refuse the newer schema.

    A database whose schema is newer than this statekeel is refused and left as it is.
    """
    url, keys = store_url(db), store_keys(key_file)
    out = console()
    new = _new_file(url)
    if new is not None and not check:
        if not create:
            raise Failure(f"{new} (nothing was created); pass --create to create a store there")
        version, pending = 0, [0]  # a new store: every migration applies
    else:
        version, pending = run(_schema_version(url, keys), f"cannot read the schema of {redact_url(url)}")
    if check:
        if as_json:
            echo_json({"schema_version": version, "pending": pending})
        elif pending:
            out.print(
                f"schema version {version}: {counted(len(pending), 'migration')} pending "
                f"({', '.join(map(str, pending))}); run: statekeel migrate"
            )
        else:
            out.print(f"schema version {version}: up to date")
        ctx.exit(1 if pending else 0)
    after = run(_migrate(url, keys), f"cannot migrate {redact_url(url)}")
    if as_json:
        echo_json({"schema_version_before": version, "schema_version": after})
    elif after == version and not pending:
        out.print(f"schema version {after}: already up to date")
    else:
        out.print(f"schema version {version} → {after}: {counted(after - version, 'migration')} applied")


async def _backup(url: str, keys: Keys | None, dest: str) -> BackupReport:
    async with open_for_reading(url, keys) as store:
        return await store.backup(dest)


@main.command()
@store_options
@click.argument("dest", type=click.Path(dir_okay=False))
def backup(db: str | None, key_file: str | None, dest: str) -> None:
    """Write a consistent copy of the store to the new SQLite file DEST (owner-only), while agents keep
    using the store: SQLite's online backup for a SQLite store, a verified copy_store for PostgreSQL.

    DEST must not exist: a backup never overwrites a file. Encrypted values stay sealed in the backup
    (no key is needed to take it; reading it needs the store's keys).
    """
    url, keys = store_url(db), store_keys(key_file)
    report = run(_backup(url, keys, dest), f"cannot back up {redact_url(url)}")
    console().print(
        f"backed up {redact_url(url)} to {report.path}: {size_text(report.bytes)} in "
        f"{report.seconds:.2f} s ({report.method})",
        markup=False,
    )


@contextmanager
def _progress(transient: bool = False) -> Iterator[Progress]:
    with Progress(
        TextColumn("{task.description:<24}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console(),
        transient=transient,
    ) as progress:
        yield progress


async def _copy(src: str, dst: str, force: bool, batch_size: int, progress: Progress) -> CopyReport:
    tasks: dict[str, Any] = {}

    def on_batch(table: str, copied: int) -> None:
        if table not in tasks:
            tasks[table] = progress.add_task(table, total=None)
        progress.update(tasks[table], completed=copied)

    async with open_for_reading(src) as source, open_store(dst) as dest:
        try:
            report = await copy_store(source, dest, batch_size=batch_size, overwrite=force, on_batch=on_batch)
        except ConflictError as exc:
            rows = exc.fields.get("rows")
            if force or tasks or rows is None:
                raise  # not the refusal of a destination that holds data
            raise Failure(
                f"the destination {redact_url(dst)} is not empty ({exc.fields.get('table')} holds "
                f"{counted(rows, 'row') if isinstance(rows, int) else rows}); nothing was copied: "
                "pass --force to replace its contents, or copy into a new store"
            ) from None
    for item in report.tables:
        if item.table in tasks:
            progress.update(tasks[item.table], total=item.source_rows, completed=item.destination_rows)
    return report


@main.command()
@click.argument("src_url")
@click.argument("dst_url")
@click.option("--force", is_flag=True, help="Replace the contents of a destination that holds data.")
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=1000, show_default=True)
@click.pass_context
def copy(ctx: click.Context, src_url: str, dst_url: str, force: bool, batch_size: int) -> None:
    """Copy every kind of state from the store at SRC_URL to the store at DST_URL (copy_store), e.g. from
    SQLite to PostgreSQL, then compare the row counts and every row.

    The destination is created or migrated if needed; one that holds data is refused unless --force.
    Stop the source's agents first: rows written meanwhile fail the check. A copy that fails leaves no
    new SQLite file behind.

    Encrypted values are copied as they are, sealed, without a key: the copy is read with the source's
    keys. Copying over a plain store (--force) gives an encrypted one, and the other way round.
    """
    src, dst = store_url(src_url, "SRC_URL"), store_url(dst_url, "DST_URL")
    require_existing(src)
    created = _new_sqlite_file(dst)
    try:
        with _progress() as progress:
            report = run(_copy(src, dst, force, batch_size, progress), f"cannot copy to {redact_url(dst)}")
        _print_copy(report, src, dst)
    except BaseException:
        # A copy that fails (or is interrupted) leaves no store behind that was not there before.
        if created is not None:
            discard_files(created)
        raise


def _new_sqlite_file(url: str) -> str | None:
    """The path of the SQLite file ``url`` names if the command would create it (it does not exist)."""
    path = sqlite_file(url)
    return path if path is not None and not os.path.lexists(path) else None


def _print_copy(report: CopyReport, src: str, dst: str) -> None:
    out = console()
    table = Table(show_edge=False)
    for column in ("table", "copied", "source rows", "destination rows"):
        table.add_column(column)
    for item in report.tables:
        table.add_row(item.table, str(item.copied), str(item.source_rows), str(item.destination_rows))
    out.print(table)
    if not report.verified:
        raise Failure("the row counts of the source and the destination differ")
    out.print(
        f"copied {counted(report.copied, 'row')} from {redact_url(src)} to {redact_url(dst)} in "
        f"{report.seconds:.2f} s; "
        "every table verified"
        + (" (the destination's earlier contents were replaced)" if report.overwritten else ""),
        markup=False,
    )


def _days(value: float | None, default: dt.timedelta | float | None) -> dt.timedelta | float | None:
    return default if value is None else dt.timedelta(days=value)


async def _gc(
    url: str, keys: Keys | None, retention: Retention, dry_run: bool, vacuum: bool, progress: Progress | None
) -> tuple[PurgeReport, int | None]:
    async with open_for_reading(url, keys, retention=retention) as store:
        if dry_run or progress is None:
            report = await store.purge(dry_run=dry_run)
        else:
            # A dry run first gives the bar its total; the purge then deletes what it counted (and what
            # aged meanwhile).
            todo = (await store.purge(dry_run=True)).total
            task = progress.add_task("purging", total=todo or None)
            report = await store.purge(
                on_batch=lambda counts: progress.update(task, completed=min(sum(counts.values()), todo))
            )
            progress.update(task, total=max(todo, report.total), completed=report.total)
        free = await store.vacuum() if vacuum and not dry_run else None
        return report, free


def _age_option(kind: str, what: str) -> Callable[[F], F]:
    default = getattr(Retention(), kind)
    days = default.days if isinstance(default, dt.timedelta) else default
    return click.option(
        f"--{kind}",
        type=click.FloatRange(min=0),
        default=None,
        metavar="DAYS",
        help=f"Keep {what} this many days (default {days}).",
    )


@main.command()
@store_options
@json_option
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@_age_option("traces", "spans")
@_age_option("tasks", "finished tasks")
@_age_option("sessions", "archived sessions")
@_age_option("memories", "forgotten or expired memories")
@click.option("--vacuum", is_flag=True, help="Then rewrite a SQLite file without its free pages (VACUUM).")
def gc(
    db: str | None,
    key_file: str | None,
    as_json: bool,
    dry_run: bool,
    traces: float | None,
    tasks: float | None,
    sessions: float | None,
    memories: float | None,
    vacuum: bool,
) -> None:
    """Delete what retention allows (store.purge()): old spans, finished tasks, archived sessions and
    forgotten memories past their ages, in short batches. Never an audit entry, an approval, an unfinished
    task or a session that is not archived.
    """
    url, keys = store_url(db), store_keys(key_file)
    base = Retention()
    retention = Retention(
        traces=_days(traces, base.traces),
        tasks=_days(tasks, base.tasks),
        sessions=_days(sessions, base.sessions),
        memories=_days(memories, base.memories),
    )
    doing = f"cannot purge {redact_url(url)}"
    if dry_run or as_json:
        report, free = run(_gc(url, keys, retention, dry_run, vacuum, None), doing)
    else:
        with _progress() as progress:
            report, free = run(_gc(url, keys, retention, dry_run, vacuum, progress), doing)
    if as_json:
        echo_json({"report": report, "total": report.total, "free_pages_after_vacuum": free})
        return
    out = console()
    table = Table(show_edge=False)
    table.add_column("kind")
    table.add_column("would delete" if dry_run else "deleted")
    for kind, n in report.counts.items():
        table.add_row(kind, str(n))
    out.print(table)
    verb = "would delete" if dry_run else "deleted"
    out.print(
        f"{verb} {counted(report.total, 'row')} in {counted(report.batches, 'batch')}, "
        f"{report.seconds:.2f} s "
        f"(longest batch {report.longest_batch_seconds * 1000:.0f} ms)"
    )
    if report.free_pages is not None:
        out.print(f"free pages left in the file: {report.free_pages} (given back: {report.reclaimed_pages})")
    if free is not None:
        out.print(f"vacuumed: {counted(free, 'free page')} left")


async def _rotate(
    url: str, keys: Keys, encrypt_existing: bool, batch_size: int, progress: Progress | None
) -> RotationReport:
    tasks: dict[str, Any] = {}

    def on_batch(table: str, scanned: int, rewritten: int) -> None:
        if progress is None:
            return
        if table not in tasks:
            tasks[table] = progress.add_task(table, total=None)
        progress.update(tasks[table], completed=scanned)

    async with open_for_reading(url, keys, encrypt_existing=encrypt_existing) as store:
        return await store.rotate_encryption_key(batch_size=batch_size, on_batch=on_batch)


@main.command("rotate-key")
@store_options
@json_option
@click.option(
    "--encrypt-existing",
    is_flag=True,
    help="Also encrypt the values stored in plaintext (to turn encryption on for a store written without "
    "a key).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 100_000),
    default=500,
    show_default=True,
    help="Rows re-encrypted per transaction.",
)
def rotate_key(
    db: str | None, key_file: str | None, as_json: bool, encrypt_existing: bool, batch_size: int
) -> None:
    """Re-encrypt every encrypted value under the current key — the first key of the key file — reading
    the others with the keys on its later lines (store.rotate_encryption_key()). Each batch commits on its
    own while agents keep using the store; interrupted, it is run again and continues.

    Afterwards the old keys can be removed from the key file. With --encrypt-existing, plaintext values
    (written before encryption was turned on) are encrypted too.
    """
    url, keys = store_url(db), store_keys(key_file)
    if keys is None:
        raise Failure(
            f"rotate-key needs the store's keys: pass --key-file PATH (or set ${KEY_FILE_ENV}), a file "
            "with the new key on its first line and the old keys after it"
        )
    doing = f"cannot rotate the encryption key of {redact_url(url)}"
    if as_json:
        report = run(_rotate(url, keys, encrypt_existing, batch_size, None), doing)
        echo_json({**_plain_report(report), "total_rewritten": report.total_rewritten})
        return
    with _progress(transient=True) as progress:
        report = run(_rotate(url, keys, encrypt_existing, batch_size, progress), doing)
    out = console()
    table = Table(show_edge=False)
    for column in ("table", "rows read", "rows re-encrypted"):
        table.add_column(column)
    for name, scanned in report.scanned.items():
        table.add_row(name, str(scanned), str(report.rewritten.get(name, 0)))
    out.print(table)
    extra = " — the old keys can now be removed from the key file" if len(keys) > 1 else ""
    out.print(
        f"re-encrypted {report.total_rewritten} of {sum(report.scanned.values())} rows under key id "
        f"{report.key_id}{extra}",
        markup=False,
    )


def _plain_report(report: RotationReport) -> dict[str, Any]:
    return {"key_id": report.key_id, "scanned": dict(report.scanned), "rewritten": dict(report.rewritten)}
