"""``store.recover()``: restore the *meaning* of the state after a crash, not just its bytes.

One pass, idempotent (a second run finds nothing to repair):

1. schema version and the storage engine's integrity check; the audit chain is verified;
2. fallback files written while the backend was down are replayed into it;
3. sessions whose tool calls have no result get an explicit interrupted result per call, in the
   transcript's own format (OpenAI chat, OpenAI Responses, Anthropic), so the next LLM call is valid —
   only calls a process that is gone left (a live agent may still be running its tool) and whose
   function was never started through ``sessions.run_tool`` (those are in doubt, listed in
   ``tool_calls_in_doubt``). The sessions are found through an index of those with waiting calls, never
   by reading every session;
4. running tasks whose lease expired become ``interrupted``;
5. what needs a decision is listed, not guessed: steps in doubt, pending approvals, unfinished workflows,
   open contradictions between memories, and (given ``files_root``) files that drifted from the ledger.
6. spans a full trace buffer dropped are counted (``traces_dropped``, over the life of the store).

With ``repair=False`` nothing is written; the report says what a repair would do.

    report = await store.recover()
    for step in report.steps_in_doubt:
        ...  # check the side effect, then store.tasks.resolve_step(...)
    for call in report.tool_calls_in_doubt:
        ...  # check the side effect, then store.sessions.resolve_tool(session, call.call_id, ...)
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .transcripts import INTERRUPTED_TEXT

if TYPE_CHECKING:
    from .approvals import Approval
    from .audit import AuditVerification
    from .backends.base import Contradiction, Drift, SessionStepRecord, StepRecord
    from .fallback import ReplayReport
    from .store import Store
    from .tasks import Task
    from .workflows import Workflow

log = logging.getLogger("statekeel.recovery")

INTERRUPTED_CONTENT = INTERRUPTED_TEXT
_PAGE = 500
# Heartbeats of processes that left no calls behind are dropped this long after they expired.
_HEARTBEAT_RETENTION = dt.timedelta(days=1)


@dataclass(slots=True)
class RecoveryReport:
    """What ``store.recover()`` found and did. ``ok`` is False when something needs a person."""

    schema_version: int = 0
    integrity_problems: list[str] = field(default_factory=list)
    audit: AuditVerification | None = None
    fallback: ReplayReport | None = None
    # session key -> tool call ids answered with an "interrupted" result (or that would be, repair=False)
    orphaned_tool_calls: dict[str, list[str]] = field(default_factory=dict)
    # held by a live agent, or with calls a live process may still be running: left alone
    sessions_busy: list[str] = field(default_factory=list)
    # session key -> why it could not be checked or repaired (e.g. a damaged history); the others were
    sessions_failed: dict[str, str] = field(default_factory=dict)
    interrupted_tasks: list[Task] = field(default_factory=list)
    steps_in_doubt: list[StepRecord] = field(default_factory=list)
    # sessions' tool calls started through run_tool by a process that is gone, without a result
    tool_calls_in_doubt: list[SessionStepRecord] = field(default_factory=list)
    pending_approvals: list[Approval] = field(default_factory=list)
    unfinished_workflows: list[Workflow] = field(default_factory=list)
    open_contradictions: list[Contradiction] = field(default_factory=list)
    drifted_files: list[Drift] = field(default_factory=list)  # only when recover() was given files_root
    traces_dropped: int = 0  # spans lost to a full trace buffer, over the life of the store
    repaired: bool = True

    @property
    def ok(self) -> bool:
        """The store is whole: nothing corrupt, tampered or left in the fallback directory."""
        return (
            not self.integrity_problems
            and not self.sessions_failed
            and (self.audit is None or self.audit.ok)
            and (self.fallback is None or self.fallback.ok)
        )

    def summary(self) -> dict[str, Any]:
        """Counts per item, for logs and the CLI."""
        return {
            "schema_version": self.schema_version,
            "integrity_problems": len(self.integrity_problems),
            "audit_ok": None if self.audit is None else self.audit.ok,
            "fallback_replayed": 0 if self.fallback is None else len(self.fallback.replayed),
            "fallback_left": 0
            if self.fallback is None
            else len(self.fallback.failed) + len(self.fallback.quarantined) + len(self.fallback.skipped),
            "orphaned_tool_calls": sum(len(v) for v in self.orphaned_tool_calls.values()),
            "sessions_busy": len(self.sessions_busy),
            "sessions_failed": len(self.sessions_failed),
            "interrupted_tasks": len(self.interrupted_tasks),
            "steps_in_doubt": len(self.steps_in_doubt),
            "tool_calls_in_doubt": len(self.tool_calls_in_doubt),
            "pending_approvals": len(self.pending_approvals),
            "unfinished_workflows": len(self.unfinished_workflows),
            "open_contradictions": len(self.open_contradictions),
            "drifted_files": len(self.drifted_files),
            "traces_dropped": self.traces_dropped,
        }


async def _repair_sessions(store: Store, report: RecoveryReport, repair: bool, now: dt.datetime) -> None:
    found = await store.sessions._recover_tool_calls(repair)
    report.orphaned_tool_calls = found.repaired
    report.sessions_busy = found.busy
    report.sessions_failed = found.failed
    report.tool_calls_in_doubt = found.in_doubt
    if repair:
        await store.backend.purge_heartbeats(now - _HEARTBEAT_RETENTION)


async def _expired_leases(store: Store, now: dt.datetime) -> list[Task]:
    found: list[Task] = []
    cursor: str | None = None
    while True:
        page = await store.tasks.list(status="running", limit=_PAGE, cursor=cursor)
        found.extend(t for t in page.items if t.lease_expires_at is not None and t.lease_expires_at <= now)
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


async def recover(
    store: Store,
    *,
    repair: bool = True,
    now: dt.datetime | None = None,
    files_root: str | os.PathLike[str] | None = None,
) -> RecoveryReport:
    """See the module docstring. Raises only when the backend cannot be read at all."""
    when = dt.datetime.now(dt.UTC) if now is None else now
    report = RecoveryReport(repaired=repair)
    report.schema_version = await store.backend.schema_version()
    report.integrity_problems = await store.backend.integrity_check()
    report.audit = await store.audit.verify()
    if repair:
        report.fallback = await store.sessions.replay_fallback()
    await _repair_sessions(store, report, repair, when)
    if repair:
        report.interrupted_tasks = await store.tasks.expire_leases(now=when)
    else:
        report.interrupted_tasks = await _expired_leases(store, when)
    report.steps_in_doubt = await store.tasks.steps_in_doubt(now=when)
    report.pending_approvals = await store.approvals.pending(limit=1000)
    report.unfinished_workflows = await store.workflows.unfinished()
    report.open_contradictions = await store.memory.open_contradictions()
    if files_root is not None:
        report.drifted_files = await store.files.check(files_root)
    report.traces_dropped = await store.traces.total_dropped()
    if not report.ok:
        log.warning("recovery found problems: %s", report.summary())
    return report


__all__ = ["INTERRUPTED_CONTENT", "RecoveryReport", "recover"]
