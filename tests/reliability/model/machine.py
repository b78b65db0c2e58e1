"""The state machine: random sequences of operations and faults run against a store and against the model
(model.py); after every step the store must show what the promises allow.

Every rule is recorded as it runs; ``story_script`` turns the record of a failing example (the last one
Hypothesis runs, the shrunk one) into a Python script a person can read and run.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import conftest
import faults
import statekeel
import statekeel.tasks.rules
from helpers import database_write_locked
from statekeel.tasks import TRANSITIONS

from .model import LEASE_SECONDS, ApprovalModel, MemoryModel, SessionModel, StoreState, TaskModel

T = TypeVar("T")

CHILD = Path(__file__).with_name("child.py")

PICK = st.integers(min_value=0, max_value=1 << 16)
COUNT = st.integers(min_value=1, max_value=4)
ARGS = st.sampled_from([{"cmd": "ls"}, {"cmd": "make"}])
SQL_KINDS = {"memory", "sqlite", "postgres", "mariadb"}
# What each engine holds beyond sessions and audit (a plain NATS store: sessions, audit, traces only).
HOLDS_ALL = {"memory", "sqlite", "postgres", "mariadb", "nats+sqlite"}


def recorded(fn: Callable[..., None]) -> Callable[..., None]:
    """Keep each rule call in the machine's story, before it runs (a failing call is the story's end)."""

    @functools.wraps(fn)
    def run(self: StoreMachine, **kwargs: Any) -> None:
        self.story.append((fn.__name__, kwargs))
        fn(self, **kwargs)

    return run


def _pick(options: list[str], pick: int) -> str | None:
    return sorted(options)[pick % len(options)] if options else None


class StoreMachine(RuleBasedStateMachine):
    """Drives one store (and, for some faults, a second store object on the same data) and the model."""

    engine = "memory"
    # Set by the test when it has them: a migrated PostgreSQL template, MariaDB clones (conftest.py).
    pg_template: str | None = None
    my_clones: Any = None
    last_story: list[tuple[str, dict[str, Any]]] = []

    def __init__(self) -> None:
        super().__init__()
        # The task manager's clock (leases are judged by the writer's clock): frozen, moved only by the
        # time_passes rule, so a lease's expiry is a step of the story, never a race with the real one.
        self.clock = 0.0
        self.real_utcnow = statekeel.tasks.rules.utcnow
        base = self.real_utcnow()
        statekeel.tasks.rules.utcnow = lambda: base + dt.timedelta(seconds=self.clock)
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="sk-model-"))
        self.url = self._url()
        self.fallback = self.dir / "fallback"
        self.model = StoreState()
        self.story: list[tuple[str, dict[str, Any]]] = []
        type(self).last_story = self.story
        self.store = self.run(self._open())
        self.open_sessions: dict[str, statekeel.Session] = {}
        self.stale: set[str] = set()  # sessions another process wrote since this one loaded them

    # --- plumbing -------------------------------------------------------------------------------------

    def _url(self) -> str:
        if self.engine == "memory":
            return "memory://"
        db = self.dir / "model.db"
        if self.engine == "sqlite":
            return f"sqlite:///{db}"
        self.database = f"sk_model_{uuid.uuid4().hex[:12]}"
        if self.engine == "postgres":
            template = f' TEMPLATE "{self.pg_template}"' if self.pg_template else ""
            conftest.pg_admin(f'CREATE DATABASE "{self.database}"{template}')
            return conftest.pg_url(self.database)
        if self.engine == "mariadb":
            if self.my_clones is not None:
                self.database = self.my_clones.take()
            else:
                conftest.my_admin(
                    f"CREATE DATABASE `{self.database}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
                )
            return conftest.my_url(self.database)
        url = f"{conftest.NATS_BASE}?prefix={self.database.replace('_', '')}"
        return url + (f"&rest=sqlite:///{db}" if self.engine == "nats+sqlite" else "")

    def _drop(self) -> None:
        if self.engine == "postgres":
            conftest.pg_admin(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        elif self.engine == "mariadb":
            conftest.my_admin(f"DROP DATABASE IF EXISTS `{self.database}`")
        elif self.engine.startswith("nats"):
            conftest.delete_nats_streams(self.database.replace("_", ""))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    async def _open(self, **options: Any) -> statekeel.Store:
        if self.engine == "sqlite":
            options.setdefault("busy_timeout_ms", 100)
        return await statekeel.open_store(self.url, fallback_dir=os.fspath(self.fallback), **options)

    def holds_all(self) -> bool:
        return self.engine in HOLDS_ALL

    def teardown(self) -> None:
        try:
            self.run(self.store.close())
        finally:
            statekeel.tasks.rules.utcnow = self.real_utcnow
            self.loop.close()
            if self.engine not in ("memory", "sqlite"):
                self._drop()
            shutil.rmtree(self.dir, ignore_errors=True)

    def session(self, key: str) -> statekeel.Session:
        if key not in self.open_sessions:
            self.open_sessions[key] = self.run(self.store.sessions.get_or_create(key))
        return self.open_sessions[key]

    def forget_open(self, key: str) -> None:
        """This process drops its copy of ``key``; the next use loads the stored one."""
        session = self.open_sessions.pop(key, None)
        if session is not None:
            self.store.sessions.discard(key, session)

    def stored(self, key: str, store: statekeel.Store | None = None) -> list[str] | None:
        """What a load by another process shows of ``key``: every live message, compressed ones too."""
        other = statekeel.SessionManager((store or self.store).backend, (store or self.store).codec)
        loaded = self.run(other.load(key, include_archived=True))
        if loaded is None:
            return None
        return [str(m.get("content")) for m in loaded.messages]

    def live_keys(self) -> list[str]:
        return list(self.model.sessions)

    # --- sessions -------------------------------------------------------------------------------------

    @rule(new=st.booleans(), pick=PICK, count=COUNT)
    @recorded
    def append(self, new: bool, pick: int, count: int) -> None:
        """Add ``count`` messages to a session (a new one, or one the model holds) and save."""
        key = self.model.fresh("s") if new or not self.model.sessions else _pick(self.live_keys(), pick)
        assert key is not None
        model = self.model.sessions.setdefault(key, SessionModel())
        session = self.session(key)
        texts = [self.model.fresh(f"{key}-m") for _ in range(count)]
        for text in texts:
            session.add_message("user", text)
        if key in self.stale:
            # Another process appended since this one loaded it: the save is refused, nothing written.
            try:
                self.run(self.store.sessions.save(session))
            except statekeel.ConflictError:
                self.stale.discard(key)
                self.forget_open(key)
                return
            raise AssertionError(f"a save of {key!r} over another process's append was not refused")
        self.run(self.store.sessions.save(session))
        if model.either is not None:  # this save settles an earlier lost reply
            model.settle(self.stored(key)[: -len(texts)] or [])  # type: ignore[index]
        model.messages.extend(texts)

    @rule(pick=PICK)
    @recorded
    def load_elsewhere(self, pick: int) -> None:
        """Another process loads a session: it sees what the model holds (or one outcome in doubt)."""
        key = _pick(self.live_keys(), pick)
        if key is None:
            return
        model = self.model.sessions[key]
        other = statekeel.SessionManager(self.store.backend, self.store.codec)
        loaded = self.run(other.load(key, include_archived=True))
        seen = [] if loaded is None else [str(m.get("content")) for m in loaded.messages]
        model.settle(seen)

    @precondition(lambda self: self.engine != "nats")
    @rule(pick=PICK, at=PICK)
    @recorded
    def fork(self, pick: int, at: int) -> None:
        key = _pick(self.live_keys(), pick)
        if key is None or self.model.sessions[key].either is not None:
            return
        head = self.model.sessions[key].head
        at %= head + 1
        child = self.model.fresh(f"{key}.f")
        self.run(self.store.sessions.fork(key, at, new_key=child))
        self.model.fork(key, at, child)

    @precondition(lambda self: self.engine != "nats")
    @rule(pick=PICK, to=PICK)
    @recorded
    def rewind(self, pick: int, to: int) -> None:
        key = _pick([k for k in self.live_keys() if self.model.sessions[k].head], pick)
        if key is None or key in self.stale:
            return
        s = self.model.sessions[key]
        to = s.consolidated + to % max(1, s.head - s.consolidated)
        if not self.model.may_rewind(key, to):
            return
        self.run(self.store.sessions.rewind(key, to, reason="the model goes back"))
        self.model.rewind(key, to)
        self.forget_open(key)

    @precondition(lambda self: self.engine != "nats")
    @rule(pick=PICK, upto=PICK)
    @recorded
    def compress(self, pick: int, upto: int) -> None:
        key = _pick([k for k in self.live_keys() if self.model.sessions[k].head], pick)
        if key is None or key in self.stale:
            return
        s = self.model.sessions[key]
        upto = s.consolidated + 1 + upto % max(1, s.head - s.consolidated)
        if not self.model.may_compress(key, upto):
            return
        self.run(self.store.sessions.compress(key, upto, "summary"))
        s.consolidated = upto

    @rule(pick=PICK)
    @recorded
    def delete(self, pick: int) -> None:
        key = _pick([k for k in self.live_keys() if not self.model.has_forks(k)], pick)
        if key is None:
            return
        assert self.run(self.store.sessions.delete(key)) is True
        self.model.delete(key)
        self.forget_open(key)
        self.stale.discard(key)

    @rule(pick=PICK)
    @recorded
    def run_tool(self, pick: int) -> None:
        """The assistant calls a tool; ``run_tool`` runs it exactly once and appends its result."""
        key = _pick([k for k in self.live_keys() if k not in self.stale], pick)
        if key is None or self.model.sessions[key].either is not None:
            return
        model = self.model.sessions[key]
        session = self.session(key)
        call_id = self.model.fresh("call")
        result = self.model.fresh("result")
        session.add_message(
            "assistant",
            None,
            tool_calls=[
                {"id": call_id, "type": "function", "function": {"name": "charge", "arguments": "{}"}}
            ],
        )
        ran: list[str] = []
        got = self.run(self.store.sessions.run_tool(session, call_id, lambda: ran.append(call_id) or result))
        assert got == result and ran == [call_id], "run_tool ran its function other than exactly once"
        model.messages += ["None", result]
        model.tool_calls_ran[call_id] = result

    # --- tasks and steps ------------------------------------------------------------------------------

    @precondition(lambda self: self.holds_all())
    @rule()
    @recorded
    def create_task(self) -> None:
        task = self.run(self.store.tasks.create(self.model.fresh("task "), status="queued"))
        self.model.tasks[task.id] = TaskModel("queued", order=self.model.made)

    @precondition(lambda self: self.holds_all())
    @rule()
    @recorded
    def claim(self) -> None:
        expected = self.model.oldest_queued()
        if any(t.either is not None for t in self.model.tasks.values()):
            return  # a task in doubt may or may not be queued: claim's answer is not one thing
        task = self.run(self.store.tasks.claim("worker", lease_seconds=LEASE_SECONDS))
        assert (task.id if task else None) == expected
        if task is not None:
            self.model.tasks[task.id].claimed("worker", self.clock)
            assert task.lease_epoch == self.model.tasks[task.id].epoch

    @precondition(lambda self: self.holds_all())
    @rule(seconds=st.sampled_from([10, 30, 70]))
    @recorded
    def time_passes(self, seconds: int) -> None:
        """The writer's clock moves on: leases run out (whether or not anyone reaps them)."""
        self.clock += seconds

    @precondition(lambda self: self.holds_all())
    @rule(pick=PICK)
    @recorded
    def heartbeat(self, pick: int) -> None:
        """The worker extends the lease of a task it claimed: only while it holds it, else LeaseLost."""
        tid = _pick([t for t, m in self.model.tasks.items() if m.epoch and m.either is None], pick)
        if tid is None:
            return
        model = self.model.tasks[tid]
        if not (model.leased_to("worker", model.epoch, self.clock) and model.expires is not None):
            with contextlib.suppress(statekeel.LeaseLost):
                self.run(self.store.tasks.heartbeat(tid, "worker", model.epoch, lease_seconds=LEASE_SECONDS))
                raise AssertionError(f"a heartbeat without a live lease was taken ({model})")
            return
        task = self.run(self.store.tasks.heartbeat(tid, "worker", model.epoch, lease_seconds=LEASE_SECONDS))
        model.expires = self.clock + LEASE_SECONDS
        assert (task.status, task.lease_epoch) == ("running", model.epoch)

    @precondition(lambda self: self.holds_all())
    @rule(pick=PICK, to=st.sampled_from(["success", "failed", "suspended"]), stale=st.booleans())
    @recorded
    def finish(self, pick: int, to: str, stale: bool) -> None:
        """The worker moves a task it claimed, fenced by its lease (``stale``: with the epoch before)."""
        tid = _pick([t for t, m in self.model.tasks.items() if m.epoch and m.either is None], pick)
        if tid is None:
            return
        model = self.model.tasks[tid]
        epoch = model.epoch - 1 if stale and model.epoch > 1 else model.epoch
        fenced = dict(worker_id="worker", lease_epoch=epoch)
        if not model.leased_to("worker", epoch, self.clock):
            with contextlib.suppress(statekeel.LeaseLost):
                self.run(self.store.tasks.transition(tid, to, **fenced))
                raise AssertionError(f"a fenced transition without a live lease was made ({model})")
            return
        task = self.run(self.store.tasks.transition(tid, to, **fenced))
        model.moved(to)
        assert task.status == to

    @precondition(lambda self: self.holds_all())
    @rule()
    @recorded
    def expire_leases(self) -> None:
        """The reaper: exactly the running tasks whose lease is over become interrupted."""
        if any(t.either is not None for t in self.model.tasks.values()):
            return
        expected = self.model.expired_leases(self.clock)
        moved = self.run(self.store.tasks.expire_leases())
        assert {t.id for t in moved} == expected
        for tid in expected:
            self.model.tasks[tid].lease_expired()

    @precondition(lambda self: self.holds_all())
    @rule(pick=PICK, to=st.sampled_from(sorted(TRANSITIONS)))
    @recorded
    def transition(self, pick: int, to: str) -> None:
        tid = _pick(list(self.model.tasks), pick)
        if tid is None or self.model.tasks[tid].either is not None:
            return
        model = self.model.tasks[tid]
        if not model.may_move(to):
            with contextlib.suppress(statekeel.InvalidTransition):
                self.run(self.store.tasks.transition(tid, to))
                raise AssertionError(f"{model.status} -> {to} was allowed")
            return
        task = self.run(self.store.tasks.transition(tid, to))
        model.moved(to)
        assert (task.status, task.retry_count, task.lease_epoch) == (to, model.retries, model.epoch)

    @precondition(lambda self: self.holds_all())
    @rule(pick=PICK, step=st.sampled_from(["fetch", "build"]), value=st.integers(0, 9))
    @recorded
    def step(self, pick: int, step: str, value: int) -> None:
        tid = _pick(list(self.model.tasks), pick)
        if tid is None:
            return
        model = self.model.tasks[tid]
        calls: list[int] = []
        got = self.run(self.store.tasks.step(tid, step, lambda: calls.append(value) or value))
        if step in model.steps:
            assert calls == [] and got == model.steps[step], "a step that ran once ran again"
        else:
            assert calls == [value] and got == value
            model.steps[step] = value

    # --- approvals ------------------------------------------------------------------------------------

    @precondition(lambda self: self.holds_all())
    @rule(args=ARGS)
    @recorded
    def request(self, args: dict[str, str]) -> None:
        approval = self.run(self.store.approvals.request("repo", "shell", args, "agent"))
        self.model.approvals[approval.id] = ApprovalModel(dict(args), order=self.model.made)
        self.model.made += 1

    @precondition(lambda self: self.holds_all())
    @rule(pick=PICK, granted=st.booleans())
    @recorded
    def decide(self, pick: int, granted: bool) -> None:
        aid = _pick(list(self.model.approvals), pick)
        if aid is None:
            return
        model = self.model.approvals[aid]
        if model.status != "pending":
            with contextlib.suppress(statekeel.ConflictError):
                self.run(self.store.approvals.decide(aid, granted, "alice"))
                raise AssertionError("an approval was decided twice")
            return
        self.run(self.store.approvals.decide(aid, granted, "alice"))
        model.status = "granted" if granted else "denied"

    @precondition(lambda self: self.holds_all())
    @rule(args=ARGS)
    @recorded
    def check_and_consume(self, args: dict[str, str]) -> None:
        expected = self.model.usable_approval(args)
        found = self.run(self.store.approvals.check("repo", "shell", args))
        assert (found.id if found else None) == expected
        if expected is not None:
            self.run(self.store.approvals.consume(expected, "agent"))
            self.model.approvals[expected].consumed = True

    # --- memories -------------------------------------------------------------------------------------

    @precondition(lambda self: self.holds_all())
    @rule(key=st.sampled_from(["tz", "lang"]))
    @recorded
    def remember(self, key: str) -> None:
        content = self.model.fresh("fact ")
        memory = self.run(self.store.memory.put("semantic", key, content, actor="agent"))
        model = self.model.memories.setdefault(memory.id, MemoryModel(content))
        model.content = content
        model.events.append("put")
        for mid, other in self.model.memories.items():
            assert mid == memory.id or other.forgotten or other.content != content

    @precondition(lambda self: self.holds_all())
    @rule(pick=PICK)
    @recorded
    def forget(self, pick: int) -> None:
        mid = _pick([m for m, v in self.model.memories.items() if not v.forgotten], pick)
        if mid is None:
            return
        self.run(self.store.memory.forget(mid, reason="outdated", actor="alice"))
        self.model.memories[mid].forgotten = True
        assert self.run(self.store.memory.get(mid)) is None
        assert len(self.run(self.store.memory.history(mid))) >= 2

    # --- processes ------------------------------------------------------------------------------------

    @rule()
    @recorded
    def reopen(self) -> None:
        """Close the store and open it again (a clean restart)."""
        self.run(self.store.close())
        self._restarted()

    @rule()
    @recorded
    def kill9(self) -> None:
        """The process dies: its tasks stop and its connections drop, without statekeel's close (no
        lease released, no heartbeat ended, the cache gone, fallback files kept)."""
        current = asyncio.current_task  # noqa: F841  (nothing runs between run() calls)
        pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            self.run(asyncio.wait(pending))
        self.run(self.store.backend.close())
        self._restarted()

    def _restarted(self) -> None:
        self.open_sessions.clear()
        self.stale.clear()
        if self.engine == "memory":
            self.model.forget_everything()
        self.store = self.run(self._open())
        for key, model in self.model.sessions.items():
            seen = self.stored(key)
            model.settle(seen or [])
            for call_id in model.tool_calls_ran:
                # A call whose journal says it ran is never answered "interrupted" after a restart.
                assert not any("interrupted" in text and call_id in text for text in seen or []), seen

    @precondition(lambda self: self.engine not in ("memory",))
    @rule(pick=PICK)
    @recorded
    def another_process_appends(self, pick: int) -> None:
        """A second store object on the same data loads a session, appends one message and saves, between
        two calls of this one."""
        key = _pick([k for k in self.live_keys() if self.model.sessions[k].either is None], pick)
        if key is None:
            return
        text = self.model.fresh(f"{key}-other")

        async def write() -> None:
            other = await self._open()
            try:
                s = await other.sessions.get_or_create(key)
                s.add_message("user", text)
                await other.sessions.save(s)
            finally:
                await other.close()

        self.run(write())
        self.model.sessions[key].messages.append(text)
        if key in self.open_sessions:
            self.stale.add(key)

    @precondition(lambda self: self.engine in ("sqlite", "postgres", "mariadb"))
    @rule(pick=PICK, acks=st.integers(0, 2), killed=st.booleans())
    @recorded
    def another_os_process_appends(self, pick: int, acks: int, killed: bool) -> None:
        """A real second process appends to a session: it exits after ``acks`` acknowledged saves, or is
        killed with SIGKILL right after them (``killed``: its next save may be on its way). Every
        acknowledged message is kept, once; the one in flight is there or not, never half."""
        key = _pick([k for k in self.live_keys() if self.model.sessions[k].either is None], pick)
        if key is None:
            return
        prefix = self.model.fresh(f"{key}-os")
        count = acks + 3 if killed else acks
        child = subprocess.Popen(
            [sys.executable, str(CHILD), self.url, str(self.dir / "child-fallback"), key, prefix, str(count)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            heard = 0
            while heard < acks:
                line = child.stdout.readline()
                assert line.startswith("ack "), (line, child.stderr.read() if child.stderr else "")
                heard += 1
            if killed:
                child.send_signal(signal.SIGKILL)
            child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
        assert killed or child.returncode == 0, child.returncode
        model = self.model.sessions[key]
        model.messages.extend(f"{prefix}-{i}" for i in range(acks))
        if killed:
            # Saves after the last acknowledged one may have landed before the kill: a prefix of them.
            model.either = None
            seen = self.stored(key) or []
            extra = seen[len(model.messages) :]
            assert seen[: len(model.messages)] == model.messages, (seen, model.messages)
            assert extra == [f"{prefix}-{i}" for i in range(acks, acks + len(extra))], extra
            model.messages.extend(extra)
        if key in self.open_sessions:
            self.stale.add(key)

    @precondition(lambda self: self.engine in SQL_KINDS)
    @rule(pick=PICK)
    @recorded
    def atomic_rolls_back(self, pick: int) -> None:
        """A save and a task created in an ``atomic()`` block that raises: neither is there."""
        key = _pick([k for k in self.live_keys() if k not in self.stale], pick)
        if key is None or self.model.sessions[key].either is not None:
            return
        session = self.session(key)
        session.add_message("user", self.model.fresh("rolled back "))

        class Undo(Exception):
            pass

        async def block() -> None:
            async with self.store.backend.atomic():
                await self.store.sessions.save(session)
                await self.store.tasks.create("rolled back", status="queued")
                raise Undo

        with contextlib.suppress(Undo):
            self.run(block())
        self.forget_open(key)
        seen = self.stored(key)
        assert seen == self.model.sessions[key].messages, f"a rolled-back save left {seen}"

    # --- faults ---------------------------------------------------------------------------------------

    @precondition(lambda self: faults.applies(self.engine))
    @rule(pick=PICK, landed=st.booleans())
    @recorded
    def save_loses_its_reply(self, pick: int, landed: bool) -> None:
        """A save whose answer is lost (after the write landed, or before): the call returns (saved), or
        raises ``BackendUnavailable(outcome="unknown")``; the store holds one of the two histories until a
        read settles which, and each message once."""
        key = _pick([k for k in self.live_keys() if k not in self.stale], pick)
        if key is None or self.model.sessions[key].either is not None:
            return
        model = self.model.sessions[key]
        session = self.session(key)
        text = self.model.fresh(f"{key}-lost")
        session.add_message("user", text)
        with faults.lose_reply(self.engine, landed=landed):
            try:
                self.run(self.store.sessions.save(session))
            except statekeel.BackendUnavailable as exc:
                assert exc.outcome == "unknown", f"a lost reply reported as a definite answer: {exc!r}"
                model.either = [*model.messages, text]
                self.forget_open(key)
                return
        if session.fallback_file is not None:
            # Saved to this host's fallback file (the backend's answer was lost): acknowledged, so it is
            # kept; a process elsewhere, without that file, sees either history until the file is
            # replayed, and after the replay the message once, whether or not the lost write landed.
            assert self.stored(key) in ([*model.messages], [*model.messages, text])
            self.run(self.store.sessions.replay_fallback())
        model.messages.append(text)

    @precondition(lambda self: faults.applies(self.engine) and self.holds_all())
    @rule(landed=st.booleans())
    @recorded
    def step_loses_its_reply(self, landed: bool) -> None:
        """A step whose record's answer is lost: the function runs at most once, and the worker's retry
        learns what happened (runs it, or returns its result) — never ``StepInDoubt`` for a function that
        never ran."""
        tid = self.model.fresh("")
        task = self.run(self.store.tasks.create(f"task {tid}", status="queued"))
        self.model.tasks[task.id] = TaskModel("queued", order=self.model.made)
        calls: list[int] = []
        with faults.lose_reply(self.engine, landed=landed):
            try:
                got = self.run(self.store.tasks.step(task.id, "charge", lambda: calls.append(1) or 7))
            except statekeel.BackendUnavailable:
                got = None
        if got is None:
            got = self.run(self.store.tasks.step(task.id, "charge", lambda: calls.append(1) or 7))
        assert got == 7 and len(calls) <= 1
        self.model.tasks[task.id].steps["charge"] = 7

    @precondition(lambda self: self.engine in ("postgres", "mariadb"))
    @rule(pick=PICK, to=st.sampled_from(["success", "failed", "suspended"]), landed=st.booleans())
    @recorded
    def finish_loses_its_reply(self, pick: int, to: str, landed: bool) -> None:
        """The worker's fenced transition whose answer is lost: outcome unknown, and its retry learns
        what happened — the task its change left, or the change made now; never LeaseLost for its own."""
        tid = _pick([t for t, m in self.model.tasks.items() if m.epoch and m.either is None], pick)
        if tid is None:
            return
        model = self.model.tasks[tid]
        if not model.leased_to("worker", model.epoch, self.clock):
            return
        fenced = dict(worker_id="worker", lease_epoch=model.epoch)
        with faults.lose_reply(self.engine, landed=landed):
            try:
                task = self.run(self.store.tasks.transition(tid, to, **fenced))
            except statekeel.BackendUnavailable as exc:
                assert exc.outcome == "unknown", f"a lost reply reported as a definite answer: {exc!r}"
                task = None
        if task is None:
            task = self.run(self.store.tasks.transition(tid, to, **fenced))
        model.moved(to)
        assert task.status == to and task.retry_count == model.retries

    @precondition(lambda self: self.engine == "sqlite")
    @rule(pick=PICK)
    @recorded
    def save_while_unavailable(self, pick: int) -> None:
        """SQLite's write lock held by another connection: the save goes to its fallback file; this store
        loads it from there, and it is replayed into the database later (by ``replay_fallback``)."""
        key = _pick([k for k in self.live_keys() if k not in self.stale], pick)
        if key is None or self.model.sessions[key].either is not None:
            return
        session = self.session(key)
        text = self.model.fresh(f"{key}-fb")
        session.add_message("user", text)
        with database_write_locked(self.dir / "model.db"):
            self.run(self.store.sessions.save(session))
        self.model.sessions[key].messages.append(text)
        self.run(self.store.sessions.replay_fallback())

    # --- export and import ----------------------------------------------------------------------------

    # A paired NATS store refuses a row copy (its sessions, audit and traces are events, not rows).
    @precondition(lambda self: self.holds_all() and self.engine != "nats+sqlite")
    @rule()
    @recorded
    def export_then_import(self) -> None:
        """An export imported into a fresh store holds every session as this one does."""
        path = self.dir / f"export-{uuid.uuid4().hex[:6]}.skx"

        async def round_trip() -> dict[str, list[str] | None]:
            await statekeel.export_store(self.store, path)
            async with statekeel.open_store(f"sqlite:///{self.dir / 'imported.db'}") as fresh:
                await statekeel.import_store(fresh, path)
                out: dict[str, list[str] | None] = {}
                for key in self.model.sessions:
                    loaded = await fresh.sessions.load(key, include_archived=True)
                    out[key] = None if loaded is None else [str(m.get("content")) for m in loaded.messages]
                return out

        try:
            imported = self.run(round_trip())
        finally:
            for leftover in self.dir.glob("imported.db*"):
                leftover.unlink()
            path.unlink(missing_ok=True)
        for key, model in self.model.sessions.items():
            assert imported[key] in model.may_be(), (key, imported[key], model.may_be())

    # --- after every step -----------------------------------------------------------------------------

    @invariant()
    def store_agrees(self) -> None:
        for key, model in self.model.sessions.items():
            seen = self.stored(key)
            assert seen is not None, f"session {key!r} is gone"
            model.settle(seen)
        if self.holds_all():
            tasks = self.run(self.store.tasks.list(limit=1000)).items
            stored = {t.id: (t.status, t.lease_epoch) for t in tasks}
            assert stored == {tid: (t.status, t.epoch) for tid, t in self.model.tasks.items()}
            for t in tasks:
                expires = self.model.tasks[t.id].expires
                at = (
                    None
                    if t.lease_expires_at is None
                    else t.lease_expires_at - statekeel.tasks.rules.utcnow()
                )
                assert at == (None if expires is None else dt.timedelta(seconds=expires - self.clock)), t
            pending = {a.id for a in self.run(self.store.approvals.pending(limit=1000))}
            assert pending == {aid for aid, a in self.model.approvals.items() if a.status == "pending"}
        report = self.run(self.store.audit.verify())
        assert report.ok, report.reason


@contextlib.contextmanager
def machine_for(engine: str) -> Iterator[StoreMachine]:
    """One machine, outside Hypothesis (for a replayed story)."""
    machine = type(f"{engine}Machine", (StoreMachine,), {"engine": engine})()
    try:
        yield machine
    finally:
        machine.teardown()


def story_script(engine: str, story: list[tuple[str, dict[str, Any]]]) -> str:
    """The story as a script a person can read and run from the repository's root."""
    lines = [
        f'"""A sequence of operations the model test found failing on {engine}; run it from the repository',
        'root with: python <this file>."""',
        "",
        "import sys",
        "",
        'sys.path[:0] = ["tests", "tests/reliability"]',
        "from model.machine import machine_for  # noqa: E402",
        "",
        f"with machine_for({engine!r}) as m:",
        "    m.store_agrees()",
    ]
    for name, kwargs in story:
        call = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        lines.append(f"    m.{name}({call})")
        lines.append("    m.store_agrees()")
    return "\n".join(lines) + "\n"
