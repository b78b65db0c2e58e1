"""``store.recover()``: restore the *meaning* of the state after a crash, not just its bytes.

One pass, idempotent (a second run finds nothing to repair):

1. schema version and the storage engine's integrity check; the audit chain is verified;
2. fallback files written while the backend was down are replayed into it;
3. sessions whose last assistant tool calls have no result get an explicit ``interrupted`` tool result
   per missing call, so the next LLM call is valid (only sessions nobody holds: a live agent may still be
   waiting for its tool);
4. running tasks whose lease expired become ``interrupted``;
5. what needs a decision is listed, not guessed: steps in doubt, pending approvals, unfinished workflows,
   open contradictions between memories, and (given ``files_root``) files that drifted from the ledger.
6. spans a full trace buffer dropped are counted (``traces_dropped``, over the life of the store);
7. sources whose vectors lag behind them are counted (``lagging_vectors``; ``vectors.rebuild`` catches up).

With ``repair=False`` nothing is written; the report says what a repair would do.

    report = await store.recover()
    for step in report.steps_in_doubt:
        ...  # check the side effect, then store.tasks.resolve_step(...)
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import ConflictError, LeaseLost, StatekeelError

if TYPE_CHECKING:
    from .approvals import Approval
    from .audit import AuditVerification
    from .backends.base import Contradiction, Drift, StepRecord
    from .fallback import ReplayReport
    from .store import Store
    from .tasks import Task
    from .workflows import Workflow

log = logging.getLogger("statekeel.recovery")

INTERRUPTED_CONTENT = "interrupted: the agent stopped before this tool call returned a result"
# How far back from a session's end to look for the assistant message whose tool calls need results.
_TAIL = 200
_PAGE = 500
_LOCK_TIMEOUT_S = 0.5


@dataclass(slots=True)
class RecoveryReport:
    """What ``store.recover()`` found and did. ``ok`` is False when something needs a person."""

    schema_version: int = 0
    integrity_problems: list[str] = field(default_factory=list)
    audit: AuditVerification | None = None
    fallback: ReplayReport | None = None
    # session key -> tool call ids answered with an "interrupted" result (or that would be, repair=False)
    orphaned_tool_calls: dict[str, list[str]] = field(default_factory=dict)
    sessions_busy: list[str] = field(default_factory=list)  # held by a live agent: left alone
    # session key -> why it could not be checked or repaired (e.g. a damaged history); the others were
    sessions_failed: dict[str, str] = field(default_factory=dict)
    interrupted_tasks: list[Task] = field(default_factory=list)
    steps_in_doubt: list[StepRecord] = field(default_factory=list)
    pending_approvals: list[Approval] = field(default_factory=list)
    unfinished_workflows: list[Workflow] = field(default_factory=list)
    open_contradictions: list[Contradiction] = field(default_factory=list)
    drifted_files: list[Drift] = field(default_factory=list)  # only when recover() was given files_root
    traces_dropped: int = 0  # spans lost to a full trace buffer, over the life of the store
    lagging_vectors: int = 0  # sources whose vectors are missing or older (derived: rebuild catches up)
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
            "pending_approvals": len(self.pending_approvals),
            "unfinished_workflows": len(self.unfinished_workflows),
            "open_contradictions": len(self.open_contradictions),
            "drifted_files": len(self.drifted_files),
            "traces_dropped": self.traces_dropped,
            "lagging_vectors": self.lagging_vectors,
        }


def missing_tool_results(messages: list[dict[str, Any]]) -> list[str]:
    """Ids of the last assistant message's tool calls that no later tool message answers.

    Understands the OpenAI chat shape: ``{"role": "assistant", "tool_calls": [{"id": ...}]}`` answered by
    ``{"role": "tool", "tool_call_id": ...}``.
    """
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls")
        if not isinstance(calls, list) or not calls:
            return []  # the last assistant message made no calls: nothing is pending
        wanted = [c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)]
        answered = {m.get("tool_call_id") for m in messages[i + 1 :] if m.get("role") == "tool"}
        return [call_id for call_id in wanted if call_id not in answered]
    return []


async def _repair_session(store: Store, report: RecoveryReport, repair: bool, key: str) -> None:
    tail = await store.backend.tail_messages(key, _TAIL)
    missing = missing_tool_results([m.payload for m in tail])
    if not missing:
        return
    if not repair:
        report.orphaned_tool_calls[key] = missing
        return
    async with store.sessions.open(key, timeout=_LOCK_TIMEOUT_S) as session:
        # Re-check under the lock: the holder we waited for may have answered them.
        missing = missing_tool_results(session.messages[-_TAIL:])
        for call_id in missing:
            session.add_message("tool", INTERRUPTED_CONTENT, tool_call_id=call_id, statekeel_interrupted=True)
    if missing:
        report.orphaned_tool_calls[key] = missing


async def _repair_sessions(store: Store, report: RecoveryReport, repair: bool) -> None:
    async for record in store.sessions.iter(status="active", page_size=_PAGE):
        try:
            await _repair_session(store, report, repair, record.key)
        except (ConflictError, LeaseLost):
            report.sessions_busy.append(record.key)
        except StatekeelError as exc:
            # One damaged session must not stop the repair of the others nor the task recovery.
            log.warning("could not check or repair session %r: %s", record.key, exc)
            report.sessions_failed[record.key] = str(exc)


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
    await _repair_sessions(store, report, repair)
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
    # Reading the memories' latest changes into the index writes: only when repairing.
    report.lagging_vectors = await store.vectors.count_lagging(sync=repair)
    if not report.ok:
        log.warning("recovery found problems: %s", report.summary())
    return report


__all__ = ["INTERRUPTED_CONTENT", "RecoveryReport", "missing_tool_results", "recover"]
