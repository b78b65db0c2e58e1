"""A model test: random sequences of session, task and approval operations run against statekeel and
against a plain in-memory model of what each call promises; both must agree after every step, across
closing and reopening the store, on memory://, SQLite and PostgreSQL.

A memory:// store forgets everything when closed, and the model says so. Hypothesis shrinks any failure
to a short sequence and prints it.

CI runs a small budget; ``STATEKEEL_MODEL_EXAMPLES=500`` (and ``STATEKEEL_MODEL_STEPS``) runs a long one.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

import statekeel
from conftest import pg_admin, pg_url
from statekeel.tasks import TRANSITIONS

T = TypeVar("T")

settings.register_profile(
    "statekeel-model",
    max_examples=int(os.environ.get("STATEKEEL_MODEL_EXAMPLES", "12")),
    stateful_step_count=int(os.environ.get("STATEKEEL_MODEL_STEPS", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# A long run (STATEKEEL_MODEL_EXAMPLES=500) outlasts the default per-test timeout: scale it.
pytestmark = pytest.mark.timeout(max(300, int(os.environ.get("STATEKEEL_MODEL_EXAMPLES", "12")) * 10))

KEYS = st.sampled_from(["alpha", "beta", "gamma"])
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
ARGS = st.fixed_dictionaries({"cmd": st.sampled_from(["ls", "rm -rf build", "make"])})


@dataclass
class ModelTask:
    status: str
    created_at: Any
    retries: int = 0
    epoch: int = 0
    steps: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelApproval:
    args: dict[str, str]
    requested_at: Any
    status: str = "pending"
    consumed: bool = False


class StoreModel(RuleBasedStateMachine):
    """Drives one store and the model; subclasses say which backend."""

    backend = "memory"
    template: str | None = None  # PostgreSQL: the migrated template database each example copies

    tasks = Bundle("tasks")
    approvals = Bundle("approvals")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = tempfile.mkdtemp(prefix="sk-model-")
        self.pg_name: str | None = None
        if self.backend == "memory":
            self.url = "memory://"
        elif self.backend == "sqlite":
            self.url = f"sqlite:///{os.path.join(self.dir, 'model.db')}"
        else:
            self.pg_name = f"sk_model_{uuid.uuid4().hex[:12]}"
            pg_admin(f'CREATE DATABASE "{self.pg_name}" TEMPLATE "{self.template}"')
            self.url = pg_url(self.pg_name)
        self.store = self.run(self._open())
        self.saved: dict[str, list[str]] = {}
        self.unsaved: dict[str, list[str]] = {}
        self.sessions: dict[str, statekeel.Session] = {}
        self.model_tasks: dict[str, ModelTask] = {}
        self.model_approvals: dict[str, ModelApproval] = {}

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    async def _open(self) -> statekeel.Store:
        return await statekeel.open_store(self.url, fallback_dir=os.path.join(self.dir, "fallback"))

    def teardown(self) -> None:
        try:
            self.run(self.store.close())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            if self.pg_name is not None:
                pg_admin(f'DROP DATABASE IF EXISTS "{self.pg_name}" WITH (FORCE)')

    # --- sessions ---------------------------------------------------------------------------------------

    @rule(key=KEYS, text=TEXT)
    def add_message(self, key: str, text: str) -> None:
        if key not in self.sessions:
            self.sessions[key] = self.run(self.store.sessions.get_or_create(key))
        self.sessions[key].add_message("user", text)
        self.unsaved.setdefault(key, []).append(text)

    @rule(key=KEYS)
    def save(self, key: str) -> None:
        if key not in self.sessions:
            return
        self.run(self.store.sessions.save(self.sessions[key]))
        self.saved.setdefault(key, []).extend(self.unsaved.pop(key, []))

    @rule(key=KEYS)
    def load_fresh(self, key: str) -> None:
        """What another process would load: the saved messages only."""
        other = statekeel.SessionManager(self.store.backend, self.store.codec)
        loaded = self.run(other.load(key))
        if key in self.saved:
            assert loaded is not None
            assert [m["content"] for m in loaded.messages] == self.saved[key]
        else:
            assert loaded is None or loaded.messages == []

    # --- tasks --------------------------------------------------------------------------------------

    @rule(target=tasks, title=TEXT.filter(bool))
    def create_task(self, title: str) -> str:
        task = self.run(self.store.tasks.create(title, status="queued"))
        self.model_tasks[task.id] = ModelTask("queued", task.created_at)
        return task.id

    @rule()
    def claim(self) -> None:
        queued = [(m.created_at, tid) for tid, m in self.model_tasks.items() if m.status == "queued"]
        task = self.run(self.store.tasks.claim("worker", lease_seconds=600))
        if not queued:
            assert task is None
            return
        assert task is not None and task.id == min(queued)[1]
        model = self.model_tasks[task.id]
        model.status, model.epoch = "running", model.epoch + 1
        assert task.lease_epoch == model.epoch

    @rule(task_id=tasks, status=st.sampled_from(sorted(TRANSITIONS)))
    def transition(self, task_id: str, status: str) -> None:
        model = self.model_tasks.get(task_id)
        if model is None:
            self._gone(self.store.tasks.transition(task_id, status))
            return
        legal = status in TRANSITIONS[model.status] and not (model.status == "failed" and model.retries >= 3)
        if not legal:
            with pytest.raises(statekeel.InvalidTransition):
                self.run(self.store.tasks.transition(task_id, status))
            return
        task = self.run(self.store.tasks.transition(task_id, status))
        if model.status == "failed":
            model.retries += 1
        if status == "running":
            model.epoch += 1
        model.status = status
        assert (task.status, task.retry_count, task.lease_epoch) == (status, model.retries, model.epoch)

    @rule(task_id=tasks, step=st.sampled_from(["fetch", "build"]), value=st.integers())
    def step(self, task_id: str, step: str, value: int) -> None:
        model = self.model_tasks.get(task_id)
        if model is None:
            self._gone(self.store.tasks.step(task_id, step, lambda: value))
            return
        calls: list[int] = []
        got = self.run(self.store.tasks.step(task_id, step, lambda: calls.append(value) or value))
        if step in model.steps:
            assert calls == [] and got == model.steps[step]  # never run twice
        else:
            assert calls == [value] and got == value
            model.steps[step] = value

    # --- approvals ------------------------------------------------------------------------------------

    @rule(target=approvals, args=ARGS)
    def request(self, args: dict[str, str]) -> str:
        approval = self.run(self.store.approvals.request("repo", "shell", args, "agent"))
        self.model_approvals[approval.id] = ModelApproval(args, approval.requested_at)
        return approval.id

    @rule(approval_id=approvals, granted=st.booleans())
    def decide(self, approval_id: str, granted: bool) -> None:
        model = self.model_approvals.get(approval_id)
        if model is None:
            self._gone(self.store.approvals.decide(approval_id, granted, "alice"))
            return
        if model.status != "pending":
            with pytest.raises(statekeel.ConflictError):
                self.run(self.store.approvals.decide(approval_id, granted, "alice"))
            return
        self.run(self.store.approvals.decide(approval_id, granted, "alice"))
        model.status = "granted" if granted else "denied"

    @rule(args=ARGS)
    def check(self, args: dict[str, str]) -> None:
        usable = sorted(
            (m.requested_at, aid)
            for aid, m in self.model_approvals.items()
            if m.args == args and m.status == "granted" and not m.consumed
        )
        found = self.run(self.store.approvals.check("repo", "shell", args))
        assert (found.id if found else None) == (usable[0][1] if usable else None)

    @rule(approval_id=consumes(approvals))
    def consume(self, approval_id: str) -> None:
        model = self.model_approvals.get(approval_id)
        if model is None:
            self._gone(self.store.approvals.consume(approval_id, "agent"))
            return
        if model.status == "granted" and not model.consumed:
            self.run(self.store.approvals.consume(approval_id, "agent"))
            model.consumed = True
        else:
            with pytest.raises((statekeel.ConflictError, statekeel.InvalidTransition)):
                self.run(self.store.approvals.consume(approval_id, "agent"))

    def _gone(self, call: Coroutine[Any, Any, Any]) -> None:
        """A record the model forgot (a memory:// store was closed) is gone from the store too."""
        with pytest.raises(statekeel.NotFound):
            self.run(call)

    # --- close and reopen -------------------------------------------------------------------------------

    @rule()
    def reopen(self) -> None:
        self.run(self.store.close())
        self.store = self.run(self._open())
        self.sessions.clear()
        self.unsaved.clear()  # never saved: gone with the process, as promised
        if self.backend == "memory":  # an in-memory store does not outlive its close
            self.saved.clear()
            self.model_tasks.clear()
            self.model_approvals.clear()
        for key, messages in self.saved.items():
            loaded = self.run(self.store.sessions.load(key))
            assert loaded is not None and [m["content"] for m in loaded.messages] == messages

    # --- after every step ---------------------------------------------------------------------------

    @invariant()
    def storage_agrees(self) -> None:
        for key, messages in self.saved.items():
            rows = self.run(self.store.backend.read_messages(key))
            assert [r.payload["content"] for r in rows] == messages
            assert [r.seq for r in rows] == list(range(len(rows)))
        stored = {t.id: t for t in self.run(self.store.tasks.list(limit=1000)).items}
        assert {tid: m.status for tid, m in self.model_tasks.items()} == {
            tid: t.status for tid, t in stored.items()
        }
        pending = {a.id for a in self.run(self.store.approvals.pending(limit=1000))}
        assert pending == {aid for aid, m in self.model_approvals.items() if m.status == "pending"}
        report = self.run(self.store.audit.verify())
        assert report.ok and report.approvals == len(self.model_approvals), report.reason


class SqliteModel(StoreModel):
    backend = "sqlite"


class PostgresModel(StoreModel):
    backend = "postgres"


def test_memory_store_agrees_with_the_model() -> None:
    StoreModel.TestCase.settings = settings.get_profile("statekeel-model")
    StoreModel.TestCase().runTest()


def test_sqlite_store_agrees_with_the_model() -> None:
    SqliteModel.TestCase.settings = settings.get_profile("statekeel-model")
    SqliteModel.TestCase().runTest()


@pytest.mark.postgres
def test_postgres_store_agrees_with_the_model(pg_template: str) -> None:
    PostgresModel.template = pg_template
    PostgresModel.TestCase.settings = settings.get_profile("statekeel-model")
    PostgresModel.TestCase().runTest()
