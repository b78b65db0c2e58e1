"""``statekeel erase SUBJECT``: delete everything about one subject (``Store.erase``); ``statekeel
create-keyring PATH``: the key ring that lets erasure reach old backups (``statekeel.create_keyring``)."""

from __future__ import annotations

import os

import click
from rich.table import Table

from ..codec.keyring import create_keyring
from ..erasure import ErasureReport
from ..store import redact_url
from ..wording import counted
from .common import (
    Failure,
    Keys,
    console,
    echo_json,
    json_option,
    key_file_option,
    open_for_reading,
    run,
    store_keys,
    store_options,
    store_url,
)
from .group import main

INCOMPLETE = 1  # exit code: the rows are deleted, but the erasure is not finished on disk


async def _erase(
    url: str, keys: Keys | None, subject: str, dry_run: bool, actor: str, reason: str, wait: float
) -> ErasureReport:
    async with open_for_reading(url, keys) as store:
        return await store.erase(subject, dry_run=dry_run, actor=actor, reason=reason, log_wait=wait)


@main.command()
@store_options
@json_option
@click.argument("subject")
@click.option("--actor", default=None, metavar="NAME", help="Who erases (default: $USER).")
@click.option("--reason", required=True, metavar="TEXT", help="Why (e.g. the request's reference).")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option(
    "--wait",
    type=click.FloatRange(0, 3600),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to retry the SQLite log's checkpoint while another connection's read holds it up.",
)
@click.pass_context
def erase(
    ctx: click.Context,
    db: str | None,
    key_file: str | None,
    as_json: bool,
    subject: str,
    actor: str | None,
    reason: str,
    dry_run: bool,
    wait: float,
) -> None:
    """Delete everything about SUBJECT (Store.erase): sessions whose key or metadata "subject" is SUBJECT,
    with their messages, archive, fallback files, episodes, file ledger records, traces and vectors;
    memories of scope SUBJECT with their history; graph relations and episodes naming it.

    Audit entries and approvals stay; one "erasure" audit entry records --actor, --reason and the counts
    (naming the subject by its SHA-256). Short batches: agents keep working. Interrupted, run it again to
    finish. A subject that matches nothing reports zeros. Exits 1 when the erasure is not finished on
    disk (on SQLite another connection's read kept the log from being checkpointed within --wait): it
    says what is left; run it again once that reader is gone.
    """
    who = actor if actor is not None else os.environ.get("USER")
    if not who:
        raise Failure("--actor is needed (and $USER is not set): say who erases")
    url, keys = store_url(db), store_keys(key_file)
    report = run(_erase(url, keys, subject, dry_run, who, reason, wait), f"cannot erase in {redact_url(url)}")
    if as_json:
        echo_json(
            {
                **report.counts,
                "leases_held": report.leases_held,
                "data_keys": report.data_keys,
                "dry_run": report.dry_run,
                "audit_seq": report.audit_seq,
                "subject_sha256": report.subject_sha256,
                "complete": report.complete,
                "left": report.left,
                "advice": report.advice,
            }
        )
        ctx.exit(0 if report.complete else INCOMPLETE)
    out = console()
    table = Table(show_edge=False)
    table.add_column("kind")
    table.add_column("would delete" if dry_run else "deleted", justify="right")
    for kind, n in report.counts.items():
        table.add_row(kind, str(n))
    out.print(table)
    verb = "would delete" if dry_run else "deleted"
    tail = "" if dry_run else f"; audit entry {report.audit_seq} records it"
    out.print(
        f"{verb} {counted(report.total, 'record')} and files in {report.seconds:.2f} s{tail}", markup=False
    )
    if report.data_keys:
        out.print(
            f"{'would destroy' if dry_run else 'destroyed'} {counted(report.data_keys, 'data key')} in the "
            "key ring: copies taken before (backups) can no longer be read for this subject",
            markup=False,
        )
    if report.leases_held:
        out.print(
            f"{counted(report.leases_held, 'session lease')} held by a live agent "
            f"{'was' if report.leases_held == 1 else 'were'} kept: run the erasure again "
            "once it has stopped",
            markup=False,
        )
    if not report.complete:
        # On stderr too, so that a script that keeps only the exit code and the errors sees it.
        click.echo(f"erasure incomplete: {report.left}; {report.advice}", err=True)
        ctx.exit(INCOMPLETE)


@main.command("create-keyring")
@key_file_option
@click.argument("path")
def create_keyring_command(key_file: str | None, path: str) -> None:
    """Create a new key ring at PATH for the store whose keys are in --key-file (the first one wraps the
    ring's data keys): then open the store with --keyring PATH (or $STATEKEEL_KEYRING), and each session's
    messages and each memory scope are sealed under data keys of their own, which "erase" destroys, so
    backups taken before can no longer be read for the erased subject.

    The file is created owner-only (0600; a missing directory 0700) and never overwritten. Back it up apart
    from the database, never in the same archive.
    """
    keys = store_keys(key_file)
    if keys is None:
        raise Failure(
            "create-keyring needs the store's keys: pass --key-file PATH (or set $STATEKEEL_KEY_FILE)"
        )
    made = run(create_keyring(path, list(keys)), f"cannot create the key ring {path}")
    console().print(f"created the key ring {made}: back it up apart from the database", markup=False)
