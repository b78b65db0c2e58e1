"""Every health check of a store, without changing it: ``await store.health()``.

It combines :meth:`Store.info` (schema, counts, integrity check, fallback files, incidents) with
``store.recover(repair=False)`` (audit chain, tool calls left without a result, expired leases, steps in
doubt, damage, drift of recorded files) and turns what they found into :class:`Finding` items, each with
what to do about it. ``ok`` is False when any finding is a *problem*; *notices* (pending approvals,
unfinished workflows, lagging vectors) are normal in a store that agents are using.

    report = await store.health()
    for finding in report.findings:
        print(finding.severity, finding.check, finding.detail, finding.advice)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .backends.base import DatabaseFiles, Incident, MigrationInfo, StateCounts
from .recovery import RecoveryReport

PROBLEM = "problem"
NOTICE = "notice"


@dataclass(frozen=True, slots=True)
class StoreInfo:
    """Schema and health facts of a store, as :meth:`Store.info` reads them.

    ``url`` has its password blanked out; ``backend`` is ``"sqlite"``, ``"memory"``, ``"postgresql"`` or
    ``"nats"``.
    ``pending_migrations`` lists ``(version, name)`` of migrations this code ships that the database has
    not applied. ``counts`` is None only when the integrity check found the schema too damaged to count.
    ``files`` gives the sizes of a SQLite store's database and WAL (None in memory and on PostgreSQL).
    ``fallback_files`` counts session fallback files waiting to be replayed. ``integrity`` lists the
    problems the storage engine's check found (empty when healthy; None when not checked). ``incidents``
    lists damage statekeel noticed in its own storage and nobody has acknowledged yet (e.g. a WAL file
    deleted before its commits were checkpointed: writes were lost). ``not_held`` names the kinds of
    ``counts`` the store does not hold (a plain ``nats://`` store: ``tasks``, ``memory`` …), whose counts
    are no count at all: not a 0.
    """

    url: str
    backend: str
    schema_version: int
    migrations: tuple[MigrationInfo, ...]
    pending_migrations: tuple[tuple[int, str], ...]
    counts: StateCounts | None
    files: DatabaseFiles | None
    fallback_dir: str | None
    fallback_files: int
    integrity: tuple[str, ...] | None
    incidents: tuple[Incident, ...] = ()
    not_held: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """The integrity check ran and found nothing, no migration is pending, no fallback file waits and
        no incident is unacknowledged."""
        return (
            self.integrity == ()
            and not self.pending_migrations
            and self.fallback_files == 0
            and not self.incidents
        )


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing a health check found: ``check`` names it (``integrity``, ``audit`` …), ``severity`` is
    ``"problem"`` or ``"notice"``, ``detail`` says what was found and ``advice`` what to do."""

    check: str
    severity: str
    detail: str
    advice: str


@dataclass(frozen=True, slots=True)
class HealthReport:
    """What :meth:`Store.health` found: the facts it read and the findings, problems first."""

    info: StoreInfo
    recovery: RecoveryReport
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    checks: tuple[str, ...] = field(default_factory=tuple)  # the checks that ran, in order

    @property
    def ok(self) -> bool:
        """No finding is a problem."""
        return not self.problems

    @property
    def problems(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == PROBLEM)


_CHECKS = (
    "integrity",
    "schema",
    "fallback",
    "incidents",
    "audit",
    "tool calls",
    "leases",
    "steps",
    "drift",
    "approvals",
    "workflows",
    "vectors",
)

_RECOVER = "run `statekeel recover` (store.recover())"


_UNCHECKED = (
    "read it (`statekeel show KEY`) to see the error: a damaged store, see the integrity check; an "
    "encrypted one, open it with its key (encryption_key, or --key-file); then run `statekeel recover`"
)


def _damage_advice(rec: RecoveryReport, integrity_problems: bool) -> str:
    """What to do about damage, from what recover() found (its structured fields, not its advice text,
    which also holds the incidents' and the audit chain's: those have findings of their own)."""
    steps: list[str] = []
    lost = [d for d in rec.damage if not d.index_only]
    indexes = [d.table for d in rec.damage if d.index_only]
    if lost or rec.skipped or (integrity_problems and not rec.damage):
        where = ", ".join(d.table for d in lost) or "the database"
        steps.append(
            f"rows of {where} cannot be read (report.damage lists them): stop the agents, then restore the "
            "store from a backup (statekeel backup), or rebuild it into a new file with sqlite3 .recover "
            "(`statekeel recover --dry-run` prints the commands); rows no backup holds are lost"
        )
    if rec.rebuilt_copy is not None:
        steps.append(
            f"a copy with every index rebuilt was written to {rec.rebuilt_copy}: stop the agents, then move "
            "it over the store (keep the old file until you have checked)"
        )
    elif indexes:
        steps.append(f"{_RECOVER} rebuilds the damaged indexes of {', '.join(indexes)}, losing nothing")
    return "; ".join(steps) or "restore the store from a backup"


def _findings(info: StoreInfo, rec: RecoveryReport) -> list[Finding]:
    found: list[Finding] = []

    def add(check: str, severity: str, detail: str, advice: str) -> None:
        found.append(Finding(check, severity, detail, advice))

    problems = list(info.integrity or ()) + [
        p for p in rec.integrity_problems if p not in (info.integrity or ())
    ]
    if problems or rec.damage or rec.skipped:
        detail = "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")
        if rec.skipped:
            detail += (" " if detail else "") + "unreadable while checking: " + ", ".join(sorted(rec.skipped))
        add("integrity", PROBLEM, detail or "damaged pages", _damage_advice(rec, bool(problems)))
    if info.pending_migrations:
        versions = ", ".join(str(v) for v, _ in info.pending_migrations)
        add(
            "schema",
            PROBLEM,
            f"schema version {info.schema_version}; migrations {versions} are pending",
            "stop the agents, back the store up (`statekeel backup`), then run `statekeel migrate`",
        )
    if info.fallback_files:
        add(
            "fallback",
            PROBLEM,
            f"{info.fallback_files} session fallback file(s) in {info.fallback_dir} wait to be replayed",
            f"{_RECOVER}: it writes them into the store once it is reachable",
        )
    for incident in rec.incidents:
        what = incident.detail.get("what_to_do", "") if isinstance(incident.detail, dict) else ""
        add(
            "incidents",
            PROBLEM,
            f"incident {incident.id} ({incident.kind}) detected {incident.detected_at.isoformat()}",
            f"{what} Then acknowledge it: store.acknowledge_incident({incident.id}, by=...)".strip(),
        )
    if rec.audit is not None and not rec.audit.ok:
        add(
            "audit",
            PROBLEM,
            f"the audit chain does not verify at entry {rec.audit.first_bad_seq}: {rec.audit.reason}",
            "treat the audit entries and approvals as untrusted; find out who changed the database "
            "(restore it from a backup taken before the change)",
        )
    if rec.audit_key_needed:
        add(
            "audit",
            PROBLEM,
            "the audit chain is keyed and a repair ran without the audit key: the store refused "
            + ", ".join(sorted(rec.audit_key_needed)),
            "open the store with its audit key (audit_key=..., or --audit-key-file) and run it again",
        )
    calls = sum(len(v) for v in rec.orphaned_tool_calls.values())
    if calls:
        add(
            "tool calls",
            PROBLEM,
            f"{calls} tool call(s) in {len(rec.orphaned_tool_calls)} session(s) have no result and their "
            "agent is gone; the next model call with these transcripts would be refused",
            f"{_RECOVER}: it answers each with an explicit 'interrupted' result",
        )
    for key, why in sorted(rec.sessions_failed.items()):
        add("tool calls", PROBLEM, f"session {key} could not be checked: {why}", _UNCHECKED)
    if rec.interrupted_tasks:
        add(
            "leases",
            PROBLEM,
            f"{len(rec.interrupted_tasks)} running task(s) hold an expired lease: their worker is gone",
            f"{_RECOVER}: it marks them interrupted, so that they can be retried",
        )
    in_doubt = len(rec.steps_in_doubt) + len(rec.tool_calls_in_doubt)
    if in_doubt:
        add(
            "steps",
            PROBLEM,
            f"{in_doubt} step(s) or tool call(s) started by a process that is gone have no outcome: "
            "their side effect may or may not have happened",
            "check the outside world, then resolve each (tasks.step / sessions.resolve_tool); non-idempotent "
            "steps are never re-run by themselves",
        )
    if rec.drifted_files:
        paths = ", ".join(d.path for d in rec.drifted_files[:3])
        add(
            "drift",
            PROBLEM,
            f"{len(rec.drifted_files)} recorded file(s) changed on disk since the agent wrote them: {paths}",
            "compare them with the file ledger (store.files.list) before an agent relies on them",
        )
    if rec.pending_approvals:
        add(
            "approvals",
            NOTICE,
            f"{len(rec.pending_approvals)} approval(s) wait for a decision",
            "decide them (approvals.decide)",
        )
    if rec.unfinished_workflows:
        add(
            "workflows",
            NOTICE,
            f"{len(rec.unfinished_workflows)} workflow(s) are unfinished",
            "advance them (workflows.advance) if no agent is running them",
        )
    if rec.lagging_vectors:
        add(
            "vectors",
            NOTICE,
            f"{rec.lagging_vectors} source(s) have no vector at their current version",
            "re-embed them with vectors.rebuild(embed, model=...)",
        )
    return sorted(found, key=lambda f: f.severity != PROBLEM)


def health(info: StoreInfo, recovery: RecoveryReport, *, drift_checked: bool) -> HealthReport:
    """The report of :meth:`statekeel.Store.health` from what the store's ``info()`` and
    ``recover(repair=False)`` read (``drift_checked``: recovery compared the file ledger with the files)."""
    checks = tuple(c for c in _CHECKS if c != "drift" or drift_checked)
    return HealthReport(
        info=info, recovery=recovery, findings=tuple(_findings(info, recovery)), checks=checks
    )


__all__ = ["NOTICE", "PROBLEM", "Finding", "HealthReport", "StoreInfo", "health"]
