"""The commands that settle what recovery reports: ``steps resolve``, ``calls resolve``, ``approvals list``
and ``approvals decide``, ``tasks requeue`` and ``tasks cancel``. Each is one library call
(``tasks.resolve_step``, ``sessions.resolve_tool``, ``approvals.pending``, ``approvals.decide``,
``tasks.requeue``, ``tasks.cancel``) whose audit entry names the ``--actor`` (default ``$USER``) and commits
with the change; what the store does not allow is refused in one line, exit 1, nothing written.

:func:`settle_commands` gives, for each item of a recovery report that needs a person, the commands that
settle it (``statekeel recover`` prints them).
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable, Coroutine
from typing import Any

import click
from rich.table import Table

from ..backends.base import StepRecord, TaskRecord
from ..recovery import RecoveryReport
from ..store import Store, redact_url
from .common import (
    F,
    Failure,
    Keys,
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
from .tasks import tasks


def actor_option(fn: F) -> F:
    """``--actor NAME``: who acts, recorded in the audit entry (default ``$USER``)."""
    return click.option(
        "--actor",
        default=None,
        metavar="NAME",
        help="Who acts, as the audit entry records it. Default: $USER.",
    )(fn)


def who_acts(actor: str | None) -> str:
    """Who acts: ``--actor``, else ``$USER``; a :class:`Failure` when neither says."""
    who = actor if actor is not None else os.environ.get("USER")
    if not who or not who.strip():
        raise Failure("say who acts: pass --actor NAME (or set $USER); the audit entry records it")
    return who


def _act(
    db: str | None,
    key_file: str | None,
    doing: str,
    action: Callable[[Store], Coroutine[Any, Any, Any]],
) -> Any:
    """Open the store named by ``--db`` (never created nor migrated), run ``action`` on it, close it; a
    refusal of the store is a one-line :class:`Failure` saying what was being done."""
    url, keys = store_url(db), store_keys(key_file)

    async def go(url: str, keys: Keys | None) -> Any:
        async with open_for_reading(url, keys) as store:
            return await action(store)

    return run(go(url, keys), f"{doing} in {redact_url(url)}")


# --- steps -------------------------------------------------------------------------------------------


@main.group()
def steps() -> None:
    """Settle a task's step in doubt (started, never finished): see statekeel recover."""


@steps.command("resolve")
@store_options
@json_option
@actor_option
@click.argument("task_id")
@click.argument("step_key")
@click.option("--succeeded", "outcome", flag_value="succeeded", help="The step's work was done.")
@click.option("--failed", "outcome", flag_value="failed", help="It was not: its next call runs it again.")
@click.option("--result", default=None, metavar="JSON", help="With --succeeded: its result, as JSON.")
@click.option("--error", default=None, metavar="TEXT", help="With --failed: what went wrong.")
@click.option(
    "--force",
    is_flag=True,
    help="Resolve it although its task runs under another worker's live lease (recorded in the audit entry).",
)
def steps_resolve(
    db: str | None,
    key_file: str | None,
    as_json: bool,
    actor: str | None,
    task_id: str,
    step_key: str,
    outcome: str | None,
    result: str | None,
    error: str | None,
    force: bool,
) -> None:
    """Settle step STEP_KEY of task TASK_ID, started and never finished: --succeeded (later calls return
    --result) or --failed (the next call runs it again). tasks.resolve_step(); its audit entry names the
    --actor.

    Refused (exit 1, nothing written) for a step that is not in doubt, and while the task runs under a
    live lease of another worker unless --force.
    """
    if outcome is None:
        raise click.UsageError("say how the step ended: --succeeded or --failed")
    if outcome == "failed" and result is not None:
        raise click.UsageError("--result goes with --succeeded; a failed step has an --error")
    if outcome == "succeeded" and error is not None:
        raise click.UsageError("--error goes with --failed")
    value: Any = None
    if result is not None:
        try:
            value = json.loads(result)
        except ValueError as exc:
            raise click.UsageError(
                f"--result is not JSON ({exc}); quote a string: --result '\"done\"'"
            ) from None
    who = who_acts(actor)
    err = None if error is None else {"type": "resolved", "message": error, "by": who}

    async def action(store: Store) -> StepRecord:
        return await store.tasks.resolve_step(
            task_id,
            step_key,
            succeeded=outcome == "succeeded",
            result=value,
            error=err,
            actor=who,
            force=force,
        )

    step = _act(db, key_file, f"cannot resolve step {step_key!r} of task {task_id!r}", action)
    if as_json:
        echo_json({"task_id": step.task_id, "step_key": step.step_key, "status": step.status, "actor": who})
        return
    console().print(f"step {step.step_key} of task {step.task_id}: {step.status} (by {who})", markup=False)


# --- calls -------------------------------------------------------------------------------------------


@main.group()
def calls() -> None:
    """Settle a tool call in doubt (its function may have run, its result was never appended)."""


@calls.command("resolve")
@store_options
@json_option
@actor_option
@click.argument("session")
@click.argument("call_id")
@click.option("--result", default=None, metavar="TEXT", help="The call's result, appended as its answer.")
@click.option("--interrupted", is_flag=True, help="Answer it as interrupted (the model sees it did not run).")
def calls_resolve(
    db: str | None,
    key_file: str | None,
    as_json: bool,
    actor: str | None,
    session: str,
    call_id: str,
    result: str | None,
    interrupted: bool,
) -> None:
    """Answer tool call CALL_ID of session SESSION with --result TEXT or --interrupted:
    sessions.resolve_tool() by key; the answer and its audit entry (naming the --actor) commit together.

    Refused (exit 1, nothing written) for a call that is not waiting for its result, a session that does
    not exist, and while a live process runs the call or holds the session.
    """
    if interrupted == (result is not None):
        raise click.UsageError("answer the call with --result TEXT or --interrupted (one of them)")
    who = who_acts(actor)

    async def action(store: Store) -> dict[str, Any]:
        if interrupted:
            return await store.sessions.resolve_tool(session, call_id, interrupted=True, actor=who)
        return await store.sessions.resolve_tool(session, call_id, result=result, actor=who)

    message = _act(db, key_file, f"cannot resolve call {call_id!r} of session {session!r}", action)
    if as_json:
        echo_json({"session": session, "call_id": call_id, "message": message, "actor": who})
        return
    how = "interrupted" if interrupted else "answered with the result given"
    console().print(f"call {call_id} of session {session}: {how} (by {who})", markup=False)


# --- approvals ---------------------------------------------------------------------------------------


@main.group()
def approvals() -> None:
    """The approvals waiting for a decision, and deciding one."""


@approvals.command("list")
@store_options
@json_option
@click.option(
    "--limit", type=click.IntRange(min=1), default=100, show_default=True, help="At most this many."
)
def approvals_list(db: str | None, key_file: str | None, as_json: bool, limit: int) -> None:
    """The pending approvals, oldest first: id, subject, action, who asked, when, when it expires.
    approvals.pending(); only reads."""
    url, keys = store_url(db), store_keys(key_file)

    async def go() -> list[Any]:
        async with open_for_reading(url, keys) as store:
            return await store.approvals.pending(limit)

    found = run(go(), f"cannot list the approvals of {redact_url(url)}")
    out = listing_console(found, as_json, "no approval is waiting for a decision")
    if out is None:
        return
    table = Table(show_edge=False)
    table.add_column("approval", no_wrap=True)
    for column in ("subject", "action", "requested by", "requested", "expires"):
        table.add_column(column, overflow="fold")
    for a in found:
        table.add_row(
            a.id,
            a.subject,
            a.action,
            a.requested_by,
            a.requested_at.strftime("%Y-%m-%d %H:%M:%S"),
            "" if a.expires_at is None else a.expires_at.strftime("%Y-%m-%d %H:%M:%S"),
            # Plain text: stored values never become markup (SafeConsole escapes control characters).
        )
    out.print(table, markup=False)
    out.print(f"{len(found)} pending")


@approvals.command("decide")
@store_options
@json_option
@actor_option
@click.argument("approval_id")
@click.option("--grant", "granted", flag_value=True, default=None, help="Grant it.")
@click.option("--deny", "granted", flag_value=False, help="Deny it.")
@click.option(
    "--reason", default=None, metavar="TEXT", help="Why, kept with the decision and its audit entry."
)
def approvals_decide(
    db: str | None,
    key_file: str | None,
    as_json: bool,
    actor: str | None,
    approval_id: str,
    granted: bool | None,
    reason: str | None,
) -> None:
    """Grant or deny pending approval APPROVAL_ID, once: approvals.decide(), decided by the --actor.

    Refused (exit 1, nothing written) for an approval already decided, expired or unknown.
    """
    if granted is None:
        raise click.UsageError("say what you decide: --grant or --deny")
    who = who_acts(actor)

    async def action(store: Store) -> Any:
        return await store.approvals.decide(approval_id, granted, who, reason=reason)

    record = _act(db, key_file, f"cannot decide approval {approval_id!r}", action)
    if as_json:
        echo_json(record)
        return
    verb = "granted" if granted else "denied"
    console().print(
        f"approval {record.id} ({record.action} on {record.subject}): {verb} by {who}", markup=False
    )


# --- tasks -------------------------------------------------------------------------------------------


def _print_task(task: TaskRecord, as_json: bool, who: str) -> None:
    if as_json:
        echo_json({"id": task.id, "status": task.status, "version": task.version, "actor": who})
        return
    console().print(f"task {task.id} ({task.title}): {task.status} (by {who})", markup=False)


@tasks.command("requeue")
@store_options
@json_option
@actor_option
@click.argument("task_id")
def tasks_requeue(
    db: str | None, key_file: str | None, as_json: bool, actor: str | None, task_id: str
) -> None:
    """Put task TASK_ID back in the queue: tasks.requeue(), audited with the --actor.

    Refused (exit 1, nothing written) for a running, succeeded or cancelled task and a failed one without
    retries left.
    """
    who = who_acts(actor)
    task = _act(
        db, key_file, f"cannot requeue task {task_id!r}", lambda s: s.tasks.requeue(task_id, actor=who)
    )
    _print_task(task, as_json, who)


@tasks.command("cancel")
@store_options
@json_option
@actor_option
@click.argument("task_id")
@click.option("--reason", required=True, metavar="TEXT", help="Why, kept with the task and its audit entry.")
def tasks_cancel(
    db: str | None, key_file: str | None, as_json: bool, actor: str | None, task_id: str, reason: str
) -> None:
    """Cancel task TASK_ID: tasks.cancel(), audited with the --actor and --reason. A running task's worker
    loses its lease.

    Refused (exit 1, nothing written) for a task that has finished.
    """
    who = who_acts(actor)
    task = _act(
        db,
        key_file,
        f"cannot cancel task {task_id!r}",
        lambda s: s.tasks.cancel(task_id, actor=who, reason=reason),
    )
    _print_task(task, as_json, who)


# --- what settles what recover() reports -------------------------------------------------------------


def _command(*words: str) -> str:
    return " ".join(shlex.quote(w) if w not in ("JSON", "TEXT") else w for w in ("statekeel", *words))


def settle_commands(report: RecoveryReport, url: str | None = None) -> list[dict[str, Any]]:
    """For each item of ``report`` that needs a person's decision — a step or tool call in doubt, a
    pending approval, an interrupted task — what it is and the commands that settle it, each complete but
    for a value only a person knows (JSON, TEXT). With ``url`` (one holding no password) they name it."""
    db = () if url is None or redact_url(url) != url else ("--db", url)
    items: list[dict[str, Any]] = []
    for s in report.steps_in_doubt:
        base = ("steps", "resolve", s.task_id, s.step_key, *db)
        items.append(
            {
                "kind": "step_in_doubt",
                "item": f"task {s.task_id} step {s.step_key}",
                "commands": [_command(*base, "--failed"), _command(*base, "--succeeded", "--result", "JSON")],
            }
        )
    for c in report.tool_calls_in_doubt:
        base = ("calls", "resolve", c.session_key, c.call_id, *db)
        items.append(
            {
                "kind": "tool_call_in_doubt",
                "item": f"session {c.session_key} call {c.call_id}",
                "commands": [_command(*base, "--interrupted"), _command(*base, "--result", "TEXT")],
            }
        )
    for a in report.pending_approvals:
        base = ("approvals", "decide", a.id, *db)
        items.append(
            {
                "kind": "pending_approval",
                "item": f"approval {a.id}",
                "commands": [_command(*base, "--grant"), _command(*base, "--deny", "--reason", "TEXT")],
            }
        )
    for t in report.interrupted_tasks:
        items.append(
            {
                "kind": "interrupted_task",
                "item": f"task {t.id}",
                "commands": [
                    _command("tasks", "requeue", t.id, *db),
                    _command("tasks", "cancel", t.id, *db, "--reason", "TEXT"),
                ],
            }
        )
    return items
