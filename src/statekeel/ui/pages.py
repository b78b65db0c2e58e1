"""The pages: each a GET handler that reads the store through its public API and renders a template."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Awaitable, Callable
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..audit import AuditEntry, AuditVerification
from ..backends.base import (
    SESSION_STATUSES,
    SPAN_STATUSES,
    TASK_STATUSES,
    WORKFLOW_STATUSES,
    StepRecord,
)
from ..errors import InvalidArgument, Unsupported
from ..validation import check_key
from .knowledge import knowledge_pages, unheld
from .layout import DagStep, dag_layout, waterfall
from .page import PageError, Ui
from .sessions import session_page, trace_sessions

PAGE_SIZE = 50
BOARD_SIZE = 12  # tasks shown per column of the board; the column links to the full list
AUDIT_PAGE = 100
APPROVALS_SHOWN = 500
WORKFLOWS_SHOWN = 200
THREADS_SHOWN = 500

Handler = Callable[[Request], Awaitable[Response]]


def _param(request: Request, name: str) -> str | None:
    value = request.query_params.get(name)
    return value if value else None


def _required(request: Request, name: str, what: str) -> str:
    value = _param(request, name)
    if value is None:
        raise PageError(400, "Bad request", f"This page needs the {what}: add ?{name}=... to the address.")
    return value


def _choice(request: Request, name: str, allowed: tuple[str, ...]) -> str | None:
    value = _param(request, name)
    if value is not None and value not in allowed:
        raise PageError(400, "Bad request", f"{name} must be one of {', '.join(allowed)}; got {value!r}.")
    return value


def _int(request: Request, name: str) -> int | None:
    value = _param(request, name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise PageError(400, "Bad request", f"{name} must be a whole number; got {value!r}.") from None
    if number < 0:
        raise PageError(400, "Bad request", f"{name} must be 0 or more; got {number}.")
    return number


@dataclasses.dataclass(frozen=True, slots=True)
class StepView:
    """A journal entry and what it means now: recorded, failed, running or in doubt."""

    step: StepRecord
    state: str


def step_state(
    step: StepRecord, task_status: str, lease_expires_at: dt.datetime | None, now: dt.datetime
) -> str:
    """``recorded`` (succeeded), ``failed``, ``running`` (started under a live lease) or ``in doubt``
    (started, and nobody is running it any more: its side effect may or may not have happened)."""
    if step.status == "succeeded":
        return "recorded"
    if step.status == "failed":
        return "failed"
    live = task_status == "running" and (lease_expires_at is None or lease_expires_at > now)
    return "running" if live else "in doubt"


@dataclasses.dataclass(frozen=True, slots=True)
class AuditRow:
    """A row of the audit page: an entry (``state`` ok, bad or after the break) or, with ``entry`` None,
    the place of a missing one."""

    seq: int
    entry: AuditEntry | None
    state: str


def audit_rows(
    entries: list[AuditEntry], verification: AuditVerification, *, after: int, filtered: bool, full: bool
) -> list[AuditRow]:
    """The rows to show: the entry where the chain breaks is flagged, the entries after it are
    unverified. On an unfiltered page, a deleted entry gets a row of its own at its place (``full``: the
    page was cut at its size, so what follows its last entry is not known)."""
    bad = verification.first_bad_seq
    rows: list[AuditRow] = []
    if not filtered and bad is not None and bad > after and all(e.seq != bad for e in entries):
        last = entries[-1].seq if entries else after
        if bad <= last or (bad == last + 1 and not full):
            rows.append(AuditRow(bad, None, "bad"))
    for entry in entries:
        state = "ok" if bad is None or entry.seq < bad else ("bad" if entry.seq == bad else "after")
        rows.append(AuditRow(entry.seq, entry, state))
    rows.sort(key=lambda r: r.seq)
    return rows


def routes(ui: Ui) -> list[BaseRoute]:
    """The routes of the UI, all GET."""

    async def overview(request: Request) -> Response:
        info = await ui.store.info(check_integrity=False)
        return ui.render(request, "overview.html", title="Overview", info=info)

    async def sessions(request: Request) -> Response:
        if not ui.store.holds("sessions"):
            return unheld(ui, request, "Sessions", "sessions")
        status = _choice(request, "status", SESSION_STATUSES)
        cursor = _param(request, "cursor")
        page = await ui.store.sessions.list(status=status, limit=PAGE_SIZE, cursor=cursor)
        return ui.render(
            request,
            "sessions.html",
            title="Sessions",
            page=page,
            status=status,
            statuses=SESSION_STATUSES,
            paged=cursor is not None,
        )

    async def session(request: Request) -> Response:
        if not ui.store.holds("sessions"):
            return unheld(ui, request, "Session", "sessions")
        key = check_key(_required(request, "key", "session key"))
        return await session_page(ui, request, key)

    async def tasks(request: Request) -> Response:
        if not ui.store.holds("tasks"):
            return unheld(ui, request, "Tasks", "tasks")
        status = _choice(request, "status", TASK_STATUSES)
        workflow_id = _param(request, "workflow")
        store = ui.store
        now = dt.datetime.now(dt.UTC)
        if status is None:
            counts = await store.backend.count_state()
            columns = []
            for name in TASK_STATUSES:
                page = await store.tasks.list(status=name, workflow_id=workflow_id, limit=BOARD_SIZE)
                columns.append((name, page.items, counts.tasks.get(name, 0), page.next_cursor is not None))
            return ui.render(
                request, "tasks.html", title="Tasks", columns=columns, now=now, workflow_id=workflow_id
            )
        cursor = _param(request, "cursor")
        page = await store.tasks.list(status=status, workflow_id=workflow_id, limit=PAGE_SIZE, cursor=cursor)
        return ui.render(
            request,
            "task_list.html",
            title=f"Tasks: {status}",
            status=status,
            page=page,
            now=now,
            workflow_id=workflow_id,
            paged=cursor is not None,
        )

    async def task(request: Request) -> Response:
        if not ui.store.holds("tasks"):
            return unheld(ui, request, "Task", "tasks")
        task_id = _required(request, "id", "task id")
        store = ui.store
        found = await store.tasks.get(task_id)
        if found is None:
            raise PageError(404, "Task not found", f"There is no task with the id {task_id!r} in this store.")
        now = dt.datetime.now(dt.UTC)
        steps = [
            StepView(s, step_state(s, found.status, found.lease_expires_at, now))
            for s in await store.tasks.steps(task_id)
        ]
        return ui.render(request, "task.html", title=f"Task {found.title}", task=found, steps=steps, now=now)

    async def workflows(request: Request) -> Response:
        if not ui.store.holds("workflows"):
            return unheld(ui, request, "Workflows", "workflows")
        status = _choice(request, "status", WORKFLOW_STATUSES)
        items = await ui.store.workflows.list(status=status, limit=WORKFLOWS_SHOWN)
        return ui.render(
            request,
            "workflows.html",
            title="Workflows",
            workflows=items,
            status=status,
            statuses=WORKFLOW_STATUSES,
            limit=WORKFLOWS_SHOWN,
        )

    async def workflow(request: Request) -> Response:
        if not ui.store.holds("workflows"):
            return unheld(ui, request, "Workflow", "workflows")
        workflow_id = _required(request, "id", "workflow id")
        found = await ui.store.workflows.get(workflow_id)
        if found is None:
            raise PageError(
                404, "Workflow not found", f"There is no workflow with the id {workflow_id!r} in this store."
            )
        dag = dag_layout([DagStep(s.name, s.depends_on, s.task.status, s.task.id) for s in found.steps])
        return ui.render(request, "workflow.html", title=f"Workflow {found.name}", workflow=found, dag=dag)

    async def approvals(request: Request) -> Response:
        if not ui.store.holds("approvals"):
            return unheld(ui, request, "Approvals", "approvals")
        pending = await ui.store.approvals.pending(limit=APPROVALS_SHOWN)
        return ui.render(request, "approvals.html", title="Approvals", pending=pending, limit=APPROVALS_SHOWN)

    async def audit(request: Request) -> Response:
        if not ui.store.holds("audit"):
            return unheld(ui, request, "Audit log", "an audit log")
        subject = _param(request, "subject")
        kind = _param(request, "kind")
        after = _int(request, "after")
        store = ui.store
        verification = await store.audit.verify()
        if after is None:
            if not verification.ok and verification.first_bad_seq is not None:
                after = max(0, verification.first_bad_seq - 10)  # open where the chain breaks
            elif subject is None and kind is None:
                after = max(0, verification.count - AUDIT_PAGE)  # the newest entries
            else:
                after = 0
        try:
            entries = await store.audit.query(subject=subject, kind=kind, limit=AUDIT_PAGE, after_seq=after)
        except InvalidArgument as exc:
            raise PageError(400, "Bad request", str(exc)) from None
        return ui.render(
            request,
            "audit.html",
            title="Audit log",
            verification=verification,
            rows=audit_rows(
                entries,
                verification,
                after=after,
                filtered=subject is not None or kind is not None,
                full=len(entries) == AUDIT_PAGE,
            ),
            after=after,
            next_after=entries[-1].seq if len(entries) == AUDIT_PAGE else None,
            subject=subject,
            kind=kind,
            page_size=AUDIT_PAGE,
        )

    async def traces(request: Request) -> Response:
        if not ui.store.holds("traces"):
            return unheld(ui, request, "Traces", "traces")
        name = _param(request, "name")
        status = _choice(request, "status", SPAN_STATUSES)
        cursor = _param(request, "cursor")
        page = await ui.store.traces.query(name=name, status=status, limit=PAGE_SIZE, cursor=cursor)
        return ui.render(
            request,
            "traces.html",
            title="Traces",
            page=page,
            name=name,
            status=status,
            statuses=SPAN_STATUSES,
            paged=cursor is not None,
        )

    async def trace(request: Request) -> Response:
        if not ui.store.holds("traces"):
            return unheld(ui, request, "Trace", "traces")
        trace_id = _required(request, "id", "trace id")
        spans = await ui.store.traces.get(trace_id)
        if not spans:
            raise PageError(
                404, "Trace not found", f"There is no span of a trace {trace_id!r} in this store."
            )
        return ui.render(
            request,
            "trace.html",
            title=f"Trace {trace_id}",
            trace_id=trace_id,
            chart=waterfall(spans),
            sessions=await trace_sessions(ui.store, trace_id, spans),
        )

    async def threads(request: Request) -> Response:
        if "checkpoints" not in ui.store.backend.kinds:
            return unheld(ui, request, "Threads", "LangGraph checkpoints")
        found = await ui.store.backend.list_checkpoint_threads(limit=THREADS_SHOWN)
        return ui.render(request, "threads.html", title="Threads", threads=found, limit=THREADS_SHOWN)

    async def recovery(request: Request) -> Response:
        # The checks of `statekeel doctor` (store.health(), over recover(repair=False)): the banner says
        # what doctor says, from the same findings.
        try:
            health = await ui.store.health(files_root=ui.files_root)
        except Unsupported as exc:
            # store.health() (and so `statekeel doctor`) visits every kind: a plain nats:// store holds
            # some of them only.
            return unheld(ui, request, "Recovery report", "every kind the health checks read", str(exc))
        return ui.render(
            request, "recovery.html", title="Recovery report", health=health, files_root=ui.files_root
        )

    stylesheet = resources.files("statekeel.ui").joinpath("static/style.css").read_bytes()

    async def style(request: Request) -> Response:
        return Response(stylesheet, media_type="text/css")

    pages: list[tuple[str, Handler]] = [
        ("/", overview),
        ("/sessions", sessions),
        ("/session", session),
        ("/tasks", tasks),
        ("/task", task),
        ("/workflows", workflows),
        ("/workflow", workflow),
        ("/traces", traces),
        ("/trace", trace),
        ("/threads", threads),
        ("/approvals", approvals),
        *knowledge_pages(ui),
        ("/audit", audit),
        ("/recovery", recovery),
        ("/static/style.css", style),
    ]
    return [Route(path, handler, methods=["GET"]) for path, handler in pages]
