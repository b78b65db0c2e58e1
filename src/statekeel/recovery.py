"""``store.recover()``: restore the *meaning* of the state after a crash, not just its bytes.

One pass, idempotent (a second run finds nothing to repair):

1. schema version and the storage engine's integrity check. When the check finds damaged pages (SQLite),
   the damage is assessed table by table — which rows no longer read, by key — and reported with what to
   do; a damaged index is rebuilt from its rows (nothing is lost). The rest of recovery goes on with
   what reads; a step that meets a damaged page is listed in ``skipped``. Incidents statekeel recorded
   about its storage (a WAL file deleted before its commits were checkpointed) are reported until
   acknowledged. The audit chain and the approvals bound to it are verified;
2. fallback files written while the backend was down are replayed into it;
3. sessions whose tool calls have no result get an explicit interrupted result per call, in the
   transcript's own format (OpenAI chat, OpenAI Responses, Anthropic), so the next LLM call is valid —
   only calls a process that is gone left (a live agent may still be running its tool) and whose
   function was never started through ``sessions.run_tool`` (those are in doubt, listed in
   ``tool_calls_in_doubt``). The sessions are found through an index of those with waiting calls, never
   by reading every session;
4. running tasks whose lease expired become ``interrupted`` (each with its audit entry);
5. what needs a decision is listed, not guessed: steps in doubt, pending approvals, unfinished workflows,
   open contradictions between memories, and (given ``files_root``) files whose bytes on disk no longer
   match the file ledger's last record of them (changed, missing or unreadable);
6. spans a full trace buffer dropped are counted (``traces_dropped``, over the life of the store);
7. sources whose vectors lag behind them are counted (``lagging_vectors``; ``vectors.rebuild`` catches up).

Each kind of finding gets one sentence in ``advice`` saying what to do about it. With ``repair=False``
nothing is written; the report says what a repair would do. ``check_integrity=False`` leaves out the
storage engine's integrity check, which reads the whole database: for frequent restarts of a large store,
with a full check run at other times (``store.info()``). Arguments are checked before anything is read
or written. ``recover()`` raises only when the store cannot be read at all.

Idempotent: a second run repairs nothing (no tool call answered, no task interrupted again); what needs a
decision is listed again, the same, until somebody settles it. Every step reads through an index of what
it looks for (sessions with waiting tool calls, running tasks, started steps, pending approvals, open
contradictions, lagging sources, the ledger's last record per path), never by reading every row of a
kind — except the two checks whose point is to read everything: the storage engine's integrity check
and the audit chain's verification, which re-hashes every entry.

    report = await store.recover()
    for step in report.steps_in_doubt:
        ...  # check the side effect, then store.tasks.resolve_step(...)
    for call in report.tool_calls_in_doubt:
        ...  # check the side effect, then store.sessions.resolve_tool(session, call.call_id, ...)
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .errors import AuditKeyRequired, InvalidArgument, StorageCorrupt
from .transcripts import INTERRUPTED_TEXT
from .validation import check_aware, check_bool

if TYPE_CHECKING:
    from .approvals import Approval, ApprovalLog
    from .audit import AuditLog, AuditVerification
    from .backends.base import (
        Contradiction,
        Damage,
        Drift,
        Incident,
        SessionStepRecord,
        StepRecord,
        StorageBackend,
    )
    from .fallback import ReplayReport
    from .files import FileLedger
    from .memory import MemoryStore
    from .sessions import SessionManager
    from .tasks import Task, TaskManager
    from .traces import TraceLog
    from .vectors import VectorIndex
    from .workflows import Workflow, WorkflowEngine

log = logging.getLogger("statekeel.recovery")

T = TypeVar("T")


class Recoverable(Protocol):
    """What recovery reads and repairs of a store (a :class:`statekeel.Store` has it): its URL and
    backend, and every manager whose state a crash can leave half done."""

    @property
    def url(self) -> str: ...
    @property
    def backend(self) -> StorageBackend: ...
    @property
    def audit(self) -> AuditLog: ...
    @property
    def sessions(self) -> SessionManager: ...
    @property
    def tasks(self) -> TaskManager: ...
    @property
    def approvals(self) -> ApprovalLog: ...
    @property
    def workflows(self) -> WorkflowEngine: ...
    @property
    def traces(self) -> TraceLog: ...
    @property
    def memory(self) -> MemoryStore: ...
    @property
    def files(self) -> FileLedger: ...
    @property
    def vectors(self) -> VectorIndex: ...

    def holds(self, kind: str) -> bool:
        """Whether the store's backend holds ``kind`` (a manager's name or a state kind)."""
        ...


INTERRUPTED_CONTENT = INTERRUPTED_TEXT
_PAGE = 500
# Heartbeats of processes that left no calls behind are dropped this long after they expired.
_HEARTBEAT_RETENTION = dt.timedelta(days=1)


@dataclass(slots=True)
class RecoveryReport:
    """What ``store.recover()`` found and did. ``ok`` is False when something needs a person."""

    schema_version: int = 0
    # False when recover(check_integrity=False) left the storage engine's integrity check out.
    integrity_checked: bool = True
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
    # task id -> when the lease of each of interrupted_tasks expired (moving a task to interrupted clears
    # its lease, so its record no longer says)
    lease_expired_at: dict[str, dt.datetime] = field(default_factory=dict)
    steps_in_doubt: list[StepRecord] = field(default_factory=list)
    # sessions' tool calls started through run_tool by a process that is gone, without a result
    tool_calls_in_doubt: list[SessionStepRecord] = field(default_factory=list)
    pending_approvals: list[Approval] = field(default_factory=list)
    unfinished_workflows: list[Workflow] = field(default_factory=list)
    open_contradictions: list[Contradiction] = field(default_factory=list)
    drifted_files: list[Drift] = field(default_factory=list)  # only when recover() was given files_root
    traces_dropped: int = 0  # spans lost to a full trace buffer, over the life of the store
    lagging_vectors: int = 0  # sources whose vectors are missing or older (derived: rebuild catches up)
    repaired: bool = True
    # Tables with damaged pages: which rows no longer read (SQLite); damaged indexes rebuilt by this run.
    damage: list[Damage] = field(default_factory=list)
    indexes_rebuilt: list[str] = field(default_factory=list)
    # A copy of the database with every index rebuilt, when they could not be rebuilt in place.
    rebuilt_copy: str | None = None
    # Damage statekeel recorded about its storage and nobody acknowledged (e.g. a deleted WAL file).
    incidents: list[Incident] = field(default_factory=list)
    # Recovery steps that met a damaged page, with the error; the others ran on what reads.
    skipped: dict[str, str] = field(default_factory=dict)
    # Recovery steps whose writes the store refused because its audit chain is keyed and recover() ran
    # without the audit key (step -> the error): nothing of theirs was written.
    audit_key_needed: dict[str, str] = field(default_factory=dict)
    # What to do about what was found, one sentence per problem.
    advice: list[str] = field(default_factory=list)

    @property
    def repaired_sessions(self) -> list[str]:
        """The keys of the sessions whose tool calls were (``repaired``) or would be answered."""
        return sorted(self.orphaned_tool_calls)

    @property
    def repaired_calls(self) -> list[tuple[str, str]]:
        """Every ``(session key, call id)`` answered with an interrupted result (or that would be)."""
        return [
            (key, call) for key in sorted(self.orphaned_tool_calls) for call in self.orphaned_tool_calls[key]
        ]

    @property
    def interrupted_task_ids(self) -> list[str]:
        """The ids of the tasks moved to interrupted (or that would be)."""
        return [t.id for t in self.interrupted_tasks]

    @property
    def steps_in_doubt_ids(self) -> list[tuple[str, str]]:
        """Every ``(task id, step key)`` started and never finished."""
        return [(s.task_id, s.step_key) for s in self.steps_in_doubt]

    @property
    def pending_approval_ids(self) -> list[str]:
        """The ids of the approvals waiting for a decision."""
        return [a.id for a in self.pending_approvals]

    @property
    def needs_attention(self) -> bool:
        """Something needs a person once recover() has repaired what it can: the store is not whole
        (``ok``), or a step or tool call is in doubt, a recorded file drifted, or a repair needed the audit
        key. ``statekeel recover`` (and ``--dry-run``) exits 1 exactly then."""
        return (
            not self.ok
            or bool(self.steps_in_doubt)
            or bool(self.tool_calls_in_doubt)
            or bool(self.drifted_files)
            or bool(self.audit_key_needed)
        )

    def details(self) -> dict[str, Any]:
        """What was found and done, by name (plain JSON values), for ``recover --json`` and the viewer:
        every repaired session and call id, interrupted task, step and tool call in doubt, pending
        approval, unfinished workflow, replayed or left fallback file, incident, drifted file, damaged
        table and skipped step."""
        fallback = self.fallback
        return {
            "orphaned_tool_calls": {key: list(ids) for key, ids in sorted(self.orphaned_tool_calls.items())},
            "sessions_busy": list(self.sessions_busy),
            "sessions_failed": dict(self.sessions_failed),
            "interrupted_tasks": [
                {
                    "id": t.id,
                    "title": t.title,
                    "lease_owner": t.lease_owner,
                    "lease_epoch": t.lease_epoch,
                    "lease_expires_at": _when(self.lease_expired_at.get(t.id, t.lease_expires_at)),
                }
                for t in self.interrupted_tasks
            ],
            "steps_in_doubt": [
                {
                    "task_id": s.task_id,
                    "step_key": s.step_key,
                    "attempt": s.attempt,
                    "started_at": _when(s.started_at),
                }
                for s in self.steps_in_doubt
            ],
            "tool_calls_in_doubt": [
                {
                    "session_key": c.session_key,
                    "call_id": c.call_id,
                    "attempt": c.attempt,
                    "owner": c.owner,
                    "started_at": _when(c.started_at),
                }
                for c in self.tool_calls_in_doubt
            ],
            "pending_approvals": [
                {
                    "id": a.id,
                    "subject": a.subject,
                    "action": a.action,
                    "requested_by": a.requested_by,
                    "requested_at": _when(a.requested_at),
                    "expires_at": _when(a.expires_at),
                }
                for a in self.pending_approvals
            ],
            "unfinished_workflows": [
                {"id": w.id, "name": w.name, "status": w.status} for w in self.unfinished_workflows
            ],
            "open_contradictions": [c.id for c in self.open_contradictions],
            "fallback_replayed": {} if fallback is None else dict(fallback.replayed),
            "fallback_left": {}
            if fallback is None
            else {
                **dict(fallback.failed),
                **dict(fallback.quarantined),
                **{key: "held by this process" for key in fallback.skipped},
            },
            "drifted_files": [{"path": d.path, "kind": d.kind} for d in self.drifted_files],
            "incidents": [
                {"id": i.id, "kind": i.kind, "detected_at": _when(i.detected_at)} for i in self.incidents
            ],
            "damaged_tables": [
                {"table": d.table, "index_only": d.index_only, "unreadable": len(d.unreadable)}
                for d in self.damage
            ],
            "indexes_rebuilt": list(self.indexes_rebuilt),
            "integrity_problems": list(self.integrity_problems),
            "skipped": dict(self.skipped),
            "audit_key_needed": dict(self.audit_key_needed),
        }

    @property
    def ok(self) -> bool:
        """The store is whole: nothing damaged, lost, tampered or left in the fallback directory."""
        return (
            not self.integrity_problems
            and not self.damage
            and not self.incidents
            and not self.skipped
            and not self.sessions_failed
            and (self.audit is None or self.audit.ok)
            and (self.fallback is None or self.fallback.ok)
        )

    def summary(self) -> dict[str, Any]:
        """Counts per item, for logs and the CLI."""
        return {
            "schema_version": self.schema_version,
            "integrity_checked": self.integrity_checked,
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
            "damaged_tables": len(self.damage),
            "unreadable_rows": sum(len(d.unreadable) for d in self.damage),
            "indexes_rebuilt": len(self.indexes_rebuilt),
            "incidents": len(self.incidents),
            "skipped": len(self.skipped),
            "lagging_vectors": self.lagging_vectors,
            "audit_key_needed": len(self.audit_key_needed),
        }


def _when(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


async def _repair_sessions(
    store: Recoverable, report: RecoveryReport, repair: bool, now: dt.datetime
) -> None:
    found = await store.sessions.recover_tool_calls(repair)
    report.orphaned_tool_calls = found.repaired
    report.sessions_busy = found.busy
    report.sessions_failed = found.failed
    report.tool_calls_in_doubt = found.in_doubt
    if repair:
        await store.backend.purge_heartbeats(now - _HEARTBEAT_RETENTION)


async def _expired_leases(store: Recoverable, now: dt.datetime) -> list[Task]:
    return await store.backend.expired_task_leases(now)


async def _guarded(report: RecoveryReport, step: str, run: Callable[[], Awaitable[T]], default: T) -> T:
    """Run one recovery step; a damaged page it meets is reported in ``skipped`` and the others go on."""
    try:
        return await run()
    except StorageCorrupt as exc:
        log.warning("recovery step %s met damaged storage: %s", step, exc)
        report.skipped[step] = exc.message
        return default
    except AuditKeyRequired as exc:
        # Its write (and the audit entry it needs) was refused and rolled back: nothing of it was written.
        log.warning("recovery step %s needs the audit key: %s", step, exc)
        report.audit_key_needed[step] = exc.message
        return default


async def _assess_damage(store: Recoverable, report: RecoveryReport, repair: bool) -> None:
    """Name what the integrity check's problems cost, and rebuild damaged indexes (no data is lost)."""
    backend = store.backend
    report.damage = await backend.scan_damage()
    indexes = [d.table for d in report.damage if d.index_only]
    if repair and indexes and not any(not d.index_only for d in report.damage):
        copy = await backend.rebuild_indexes(indexes)
        if copy is not None:
            report.rebuilt_copy = copy
            return
        report.indexes_rebuilt = indexes
        report.integrity_problems = await backend.integrity_check()
        report.damage = [d for d in report.damage if not d.index_only]


def _advice(store: Recoverable, report: RecoveryReport) -> list[str]:
    advice: list[str] = []
    path = getattr(store.backend, "path", None) or store.url
    lost = [d for d in report.damage if not d.index_only]
    if lost or (report.integrity_problems and not report.damage) or report.skipped:
        rows = sum(len(d.unreadable) for d in lost)
        where = ", ".join(d.table for d in lost) or "the database"
        count = f"{rows} row(s)" + ("" if all(d.complete for d in lost) else " or more")
        advice.append(
            f"{count} of {where} cannot be read (listed in report.damage). Stop the agents using "
            f"{path}, then restore it from a backup (statekeel backup), or rebuild it into a new file with "
            f"sqlite3 (sqlite3 {path} .recover | sqlite3 new.db) and open that; the unreadable rows are "
            "lost unless the backup holds them"
        )
    indexes = [d.table for d in report.damage if d.index_only]
    if report.rebuilt_copy is not None:
        advice.append(
            f"indexes of {', '.join(indexes)} are damaged but every row reads; their pages could not be "
            f"replaced in place, so a copy with every index rebuilt was written to {report.rebuilt_copy}: "
            f"stop the agents, then move it over {path} (keep the old file until you have checked)"
        )
    elif indexes:
        advice.append(
            f"indexes of {', '.join(indexes)} are damaged but every row reads: recover() (repair=True) "
            "rebuilds them, losing nothing"
            + ("" if not lost else ", once the unreadable rows are dealt with")
        )
    for incident in report.incidents:
        todo = incident.detail.get("what_to_do", "") if isinstance(incident.detail, dict) else ""
        advice.append(
            f"incident {incident.id} ({incident.kind}, {incident.detected_at.isoformat()}): {todo} "
            f"Then call store.acknowledge_incident({incident.id}, by=...)".strip()
        )
    if report.audit is not None and not report.audit.ok:
        advice.append(
            f"the audit log does not verify ({report.audit.reason}): treat its entries and approvals as "
            "untrusted and investigate who changed the database"
        )
    if report.audit_key_needed:
        advice.append(
            f"the audit chain is keyed and recover() ran without the audit key, so the store refused the "
            f"repairs of {', '.join(sorted(report.audit_key_needed))} (nothing of them was written): run it "
            "again with the key (open_store(url, audit_key=...); statekeel recover --audit-key-file PATH)"
        )
    advice.extend(_decisions(report))
    return advice


def _decisions(report: RecoveryReport) -> list[str]:
    """One sentence per kind of finding that needs somebody (or a follow-up call), not a repair."""
    advice: list[str] = []
    done = "were" if report.repaired else "would be"
    if report.orphaned_tool_calls:
        calls = sum(len(v) for v in report.orphaned_tool_calls.values())
        advice.append(
            f"{calls} tool call(s) in {len(report.orphaned_tool_calls)} session(s) {done} answered with an "
            "interrupted result: the agent may call the tools again on its next turn"
        )
    if report.interrupted_tasks:
        advice.append(
            f"{len(report.interrupted_tasks)} task(s) whose lease expired {done} moved to interrupted: "
            "requeue them (statekeel tasks requeue ID; tasks.requeue(task_id, actor=...)) or cancel them "
            "(statekeel tasks cancel ID --reason TEXT)"
        )
    if report.steps_in_doubt:
        advice.append(
            f"{len(report.steps_in_doubt)} step(s) started and never finished (report.steps_in_doubt): check "
            "whether each side effect happened, then settle it: statekeel steps resolve TASK STEP "
            "--succeeded [--result JSON] or --failed "
            "(tasks.resolve_step(task_id, step_key, succeeded=..., actor=...))"
        )
    if report.tool_calls_in_doubt:
        advice.append(
            f"{len(report.tool_calls_in_doubt)} tool call(s) started through run_tool by a process that is "
            "gone have no result (report.tool_calls_in_doubt): check each side effect, then "
            "statekeel calls resolve SESSION CALL_ID --result TEXT or --interrupted "
            "(sessions.resolve_tool(key, call_id, result=... or interrupted=True, actor=...))"
        )
    if report.pending_approvals:
        advice.append(
            f"{len(report.pending_approvals)} approval(s) wait for a decision: statekeel approvals decide ID "
            "--grant or --deny (approvals.decide(approval_id, granted, decided_by))"
        )
    if report.unfinished_workflows:
        advice.append(
            f"{len(report.unfinished_workflows)} workflow(s) are not finished: "
            "workflows.advance(workflow_id) after their interrupted steps are requeued or ended"
        )
    if report.open_contradictions:
        advice.append(
            f"{len(report.open_contradictions)} contradiction(s) between memories are open: decide which "
            "memory holds (memory.supersede or memory.forget), then "
            "memory.resolve_contradiction(contradiction_id, resolution)"
        )
    if report.drifted_files:
        kinds = sorted({d.kind for d in report.drifted_files})
        advice.append(
            f"{len(report.drifted_files)} file(s) no longer match the ledger ({', '.join(kinds)}; "
            "report.drifted_files): something other than the agent changed them since; look at each, then "
            "record what is there now (files.record) or restore it"
        )
    if report.traces_dropped:
        advice.append(
            f"{report.traces_dropped} span(s) were dropped by a full trace buffer over the life of the "
            "store: those spans are lost; flush more often (traces.flush()) or record fewer spans"
        )
    if report.lagging_vectors:
        advice.append(
            f"{report.lagging_vectors} source(s) have no vector at their current version: search misses or "
            "ranks them on old content until vectors.rebuild(embed, model=...) catches up"
        )
    return advice


async def recover(
    store: Recoverable,
    *,
    repair: bool = True,
    now: dt.datetime | None = None,
    files_root: str | os.PathLike[str] | None = None,
    check_integrity: bool = True,
) -> RecoveryReport:
    """See the module docstring. Raises only when the backend cannot be read at all."""
    check_bool(repair, "repair")
    check_bool(check_integrity, "check_integrity")
    when = dt.datetime.now(dt.UTC) if now is None else check_aware(now, "now")
    if files_root is not None:
        root = os.fspath(files_root) if isinstance(files_root, os.PathLike) else files_root
        if type(root) is not str or not await asyncio.to_thread(os.path.isdir, root):
            raise InvalidArgument(f"files_root must name an existing directory, got {files_root!r}")
    report = RecoveryReport(repaired=repair, integrity_checked=check_integrity)
    backend = store.backend
    report.schema_version = await backend.schema_version()
    if check_integrity:
        report.integrity_problems = await backend.integrity_check()
    if report.integrity_problems:
        await _guarded(report, "damage", lambda: _assess_damage(store, report, repair), None)
    report.incidents = await _guarded(report, "incidents", backend.list_incidents, [])
    # Only the kinds the store holds: a plain NATS store recovers its sessions, audit and traces.
    held = store.holds
    if held("audit"):
        report.audit = await _guarded(report, "audit", store.audit.verify, None)
    if held("sessions"):
        if repair:
            report.fallback = await _guarded(report, "fallback", store.sessions.replay_fallback, None)
        await _guarded(report, "sessions", lambda: _repair_sessions(store, report, repair, when), None)
    if held("tasks"):
        # Read before the move clears them: when each lease expired.
        expiring: list[Task] = await _guarded(report, "tasks", lambda: _expired_leases(store, when), [])
        report.lease_expired_at = {t.id: t.lease_expires_at for t in expiring if t.lease_expires_at}
        if repair:
            report.interrupted_tasks = await _guarded(
                report, "tasks", lambda: store.tasks.expire_leases(now=when), []
            )
        else:
            report.interrupted_tasks = expiring
        moved = {t.id for t in report.interrupted_tasks}
        report.lease_expired_at = {k: v for k, v in report.lease_expired_at.items() if k in moved}
        report.steps_in_doubt = await _guarded(
            report, "steps", lambda: store.tasks.steps_in_doubt(now=when), []
        )
    if held("approvals"):
        report.pending_approvals = await _guarded(
            report, "approvals", lambda: store.approvals.pending(limit=1000), []
        )
    if held("workflows"):
        report.unfinished_workflows = await _guarded(report, "workflows", store.workflows.unfinished, [])
    if held("traces"):
        report.traces_dropped = await _guarded(report, "traces", store.traces.total_dropped, 0)
    if held("memory"):
        report.open_contradictions = await _guarded(report, "memory", store.memory.open_contradictions, [])
    if files_root is not None and held("files"):
        root_dir = files_root
        report.drifted_files = await _guarded(report, "files", lambda: store.files.check(root_dir), [])
    if held("vectors"):
        # Reading the memories' latest changes into the index writes: only when repairing.
        report.lagging_vectors = await _guarded(
            report, "vectors", lambda: store.vectors.count_lagging(sync=repair), 0
        )
    report.advice = _advice(store, report)
    if not report.ok:
        log.warning("recovery found problems: %s", report.summary())
    return report


__all__ = ["INTERRUPTED_CONTENT", "Recoverable", "RecoveryReport", "recover"]
