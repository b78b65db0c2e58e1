"""A NATS store paired with a SQL one (``nats://…?rest=SQL-URL``): sessions, the audit chain and traces on
NATS, the other kinds in SQL, and the outbox that carries the SQL kinds' audit entries to the chain — in
order, each once, also when the relaying process is killed between its publish and its mark, when two
processes relay at once, and while NATS is unreachable."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

import statekeel
from conftest import IN_CI, delete_nats_streams
from helpers import kill9_when
from statekeel.backends.base import AuditRecord


def prefix_of(url: str) -> str:
    return url.partition("prefix=")[2].partition("&")[0]


def sqlite_of(where: Path | str) -> str:
    return where if isinstance(where, str) else f"sqlite:///{where / 'state.db'}"


def paired(nats_url: str, where: Path | str, *options: str) -> str:
    """The URL of ``nats_url`` paired with the SQL store ``where`` (a URL, or a directory's state.db)."""
    extra = "".join(f"&{o}" for o in options)
    return f"{nats_url}{extra}&rest={sqlite_of(where)}"


async def outbox_rows(where: Path | str) -> int:
    async with statekeel.open_store(sqlite_of(where)) as sql:
        n, _ = await sql.backend.outbox_lag()  # type: ignore[attr-defined]
        return int(n)


async def chain(nats_url: str) -> list[AuditRecord]:
    """The audit chain as a plain NATS store of the same prefix reads it."""
    async with statekeel.open_store(nats_url) as plain:
        return await plain.backend.read_audit(limit=10_000)


async def test_a_paired_store_keeps_sessions_audit_and_traces_on_nats_and_the_rest_in_sql(
    nats_url: str, tmp_path: Path
) -> None:
    async with statekeel.open_store(paired(nats_url, tmp_path)) as store:
        async with store.sessions.open("chat") as session:
            session.add_message("user", "hi")
        task = await store.tasks.create("build")
        approval = await store.approvals.request("deploy", "run", {"env": "prod"}, "agent")
        await store.approvals.decide(approval.id, True, "alice")
        assert await store.approvals.check("deploy", "run", {"env": "prod"}) is not None
        await store.memory.put("semantic", "fact", "the sky is blue")
        await store.files.record("a.txt", "0" * 64, 1, task_id=task.id)
        store.traces.record("t1", {"span_id": "s1", "name": "tool"})
        await store.traces.flush()
        verified = await store.audit.verify()
        assert verified.ok and verified.approvals == 1 and verified.unrelayed == 0, verified
        report = await store.recover()
        assert report.ok, report.summary()
        info = await store.info()
        assert info.counts.sessions["active"] == 1 and info.counts.audit_entries == verified.count
        # Retention visits sessions as SQL rows: refused whole, before its first batch.
        with pytest.raises(statekeel.Unsupported, match="keeps its sessions on NATS"):
            await store.purge(dry_run=True)
    # A plain NATS store of the same prefix holds the session and the whole chain, the SQL store neither.
    async with statekeel.open_store(nats_url) as plain:
        loaded = await plain.sessions.load("chat")
        assert loaded is not None and [m["content"] for m in loaded.messages] == ["hi"]
        kinds = [e.kind for e in await plain.audit.query(limit=100)]
        assert kinds == ["task.created", "approval.requested", "approval.granted"]
        assert len(await plain.traces.get("t1")) == 1
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'state.db'}") as sql:
        assert await sql.sessions.load("chat") is None
        assert (await sql.tasks.get(task.id)) is not None
        assert await sql.backend.count_rows("audit_log") == 0
    assert await outbox_rows(tmp_path) == 0


async def test_kinds_traces_keeps_the_earlier_pairing_sessions_and_the_chain_in_sql(
    nats_url: str, tmp_path: Path
) -> None:
    async with statekeel.open_store(paired(nats_url, tmp_path, "kinds=traces")) as store:
        async with store.sessions.open("chat") as session:
            session.add_message("user", "hi")
        await store.tasks.create("build")
        store.traces.record("t1", {"span_id": "s1", "name": "tool"})
        await store.traces.flush()
        assert (await store.audit.verify()).ok
        await store.purge(dry_run=True)
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'state.db'}") as sql:
        loaded = await sql.sessions.load("chat")
        assert loaded is not None and [m["content"] for m in loaded.messages] == ["hi"]
        assert [e.kind for e in await sql.audit.query()] == ["task.created"]
        assert await sql.traces.get("t1") == []  # spans are on NATS
    assert await chain(nats_url) == []


async def test_a_sql_store_written_by_the_earlier_pairing_is_refused_and_left_as_it_was(
    nats_url: str, tmp_path: Path
) -> None:
    url = paired(nats_url, tmp_path, "kinds=traces")
    async with statekeel.open_store(url) as store, store.sessions.open("chat") as session:
        session.add_message("user", "kept in SQL")
    with pytest.raises(statekeel.InvalidArgument, match=r"holds 1 session\(s\).*kinds=traces"):
        await statekeel.open_store(paired(nats_url, tmp_path))
    async with statekeel.open_store(paired(nats_url, tmp_path, "kinds=traces")) as store:
        loaded = await store.sessions.load("chat")
        assert loaded is not None and [m["content"] for m in loaded.messages] == ["kept in SQL"]
    async with statekeel.open_store(nats_url) as plain:
        assert await plain.sessions.load("chat") is None


async def test_task_changes_and_approvals_reach_the_chain_in_commit_order_each_once(
    nats_url: str, shared_url: str
) -> None:
    async with statekeel.open_store(paired(nats_url, shared_url)) as store:
        task = await store.tasks.create("build", idempotency_key="b1", status="queued")
        await store.tasks.create("build", idempotency_key="b1")  # the same task: no second entry
        claimed = await store.tasks.claim("w1")
        assert claimed is not None and claimed.id == task.id
        await store.tasks.transition(
            task.id, "success", result={"ok": True}, worker_id="w1", lease_epoch=claimed.lease_epoch
        )
        await store.audit.append("note", "me", "case", {"n": 1})
        approval = await store.approvals.request("deploy", "run", {}, "agent")
        await store.approvals.decide(approval.id, False, "alice", "not now")
        entries = await store.audit.query(limit=100)
    assert [e.kind for e in entries] == [
        "task.created",
        "task.transitioned",
        "task.transitioned",
        "note",
        "approval.requested",
        "approval.denied",
    ]
    assert [e.seq for e in entries] == list(range(1, 7))
    assert [e.seq for e in await chain(nats_url)] == list(range(1, 7))
    assert await outbox_rows(shared_url) == 0


async def test_an_entry_appended_in_a_block_commits_with_the_block_and_reaches_the_chain_after_it(
    nats_url: str, tmp_path: Path
) -> None:
    async with statekeel.open_store(paired(nats_url, tmp_path)) as store:
        with pytest.raises(RuntimeError, match="changed my mind"):
            async with store.backend.atomic():
                await store.tasks.create("rolled back")
                await store.audit.append("note", "me", "case", {"n": 0})
                raise RuntimeError("changed my mind")
        assert await outbox_rows(tmp_path) == 0 and await chain(nats_url) == []
        async with store.backend.atomic():
            await store.tasks.create("kept")
            queued = await store.audit.append("note", "me", "case", {"n": 1})
            assert queued.seq == 0  # on the chain once the block committed
        assert [(e.kind, e.seq) for e in await store.audit.query()] == [("task.created", 1), ("note", 2)]
    assert await outbox_rows(tmp_path) == 0


# The child stops (writes the marker and waits) at the patched step; the parent kills it there.
_CHILD = (
    "import asyncio, sys, threading, statekeel\n"
    "from statekeel.backends.nats.audit import NatsAudit\n"
    "from statekeel.backends.sql.audit import SqlAudit\n"
    "marker = sys.argv[2]\n"
    "async def hold(*_):\n"
    "    open(marker, 'w').close()\n"
    "    threading.Event().wait()\n"
    "{patch}\n"
    "async def main():\n"
    "    async with statekeel.open_store(sys.argv[1]) as store:\n"
    "        await store.tasks.create('build')\n"
    "asyncio.run(main())\n"
)


@pytest.mark.parametrize(
    ("patch", "where"),
    [
        ("SqlAudit.outbox_relayed = hold", "between the publish and the mark"),
        ("NatsAudit.chain_publish = hold", "between the attempt and the publish"),
    ],
)
async def test_a_relay_killed_midway_leaves_the_entry_on_the_chain_exactly_once(
    nats_url: str, tmp_path: Path, patch: str, where: str
) -> None:
    url, marker = paired(nats_url, tmp_path), tmp_path / "marker"
    async with statekeel.open_store(url) as store:
        await store.audit.append("before", "me", "case", {})
    script = _CHILD.replace("{patch}", patch)
    await asyncio.to_thread(kill9_when, [script, url, str(marker)], marker.exists, where)
    published = [e.kind for e in await chain(nats_url)]
    assert published == (["before", "task.created"] if "mark" in where else ["before"])
    assert await outbox_rows(tmp_path) == 1  # the killed relay's entry waits, with its attempt
    async with statekeel.open_store(url) as store:  # opening relays what was left
        assert await outbox_rows(tmp_path) == 0
        await store.audit.append("after", "me", "case", {})
        verified = await store.audit.verify()
        assert verified.ok and verified.count == 3, verified
    assert [e.kind for e in await chain(nats_url)] == ["before", "task.created", "after"]


_PUBLISH_THEN_HOLD = (
    "real_publish = NatsAudit.chain_publish\n"
    "async def publish_then_hold(self, *args):\n"
    "    await real_publish(self, *args)\n"
    "    await hold()\n"
    "NatsAudit.chain_publish = publish_then_hold"
)


async def test_a_relay_killed_after_its_publish_is_settled_by_its_attempt_not_by_duplicate_detection(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The next relay runs after the stream's duplicate window (a restart hours later): its publish of
    # the entry is no duplicate then, so only the attempt committed before the killed publish keeps the
    # entry from landing twice.
    from statekeel.backends.nats.client import NatsConnection

    url, marker = paired(nats_url, tmp_path), tmp_path / "marker"
    async with statekeel.open_store(url) as store:
        await store.audit.append("before", "me", "case", {})
    script = _CHILD.replace("{patch}", _PUBLISH_THEN_HOLD)
    await asyncio.to_thread(kill9_when, [script, url, str(marker)], marker.exists, "just after the publish")
    assert [e.kind for e in await chain(nats_url)] == ["before", "task.created"]
    publish = NatsConnection.publish
    republished: list[str] = []

    async def past_the_duplicate_window(self: Any, subject: str, payload: bytes, **kw: Any) -> Any:
        msg_id = kw["headers"].get("Nats-Msg-Id", "")
        if msg_id.startswith("relay-"):
            republished.append(msg_id)
            kw["headers"] = {**kw["headers"], "Nats-Msg-Id": f"{msg_id}-later"}
        return await publish(self, subject, payload, **kw)

    monkeypatch.setattr(NatsConnection, "publish", past_the_duplicate_window)
    async with statekeel.open_store(url) as store:  # opening relays what was left
        assert await outbox_rows(tmp_path) == 0
        assert republished == []  # found on the chain at its attempted sequence: not sent again
        await store.audit.append("after", "me", "case", {})
        verified = await store.audit.verify()
        assert verified.ok and verified.count == 3, verified
    assert [e.kind for e in await chain(nats_url)] == ["before", "task.created", "after"]


async def test_two_processes_relaying_one_outbox_put_each_entry_on_the_chain_once(
    nats_url: str, shared_url: str
) -> None:
    url = paired(nats_url, shared_url)
    async with statekeel.open_store(url) as one, statekeel.open_store(url) as two:

        async def writer(store: statekeel.Store, name: str) -> None:
            for i in range(15):
                await store.tasks.create(f"{name}-{i}")
                if i % 5 == 0:
                    await store.audit.append("note", name, "case", {"i": i})

        await asyncio.gather(writer(one, "one"), writer(two, "two"))
        # Both relay the same outbox: each relays what it finds, also what the other one is relaying.
        await asyncio.gather(one.backend.relay_audit(), two.backend.relay_audit())  # type: ignore[attr-defined]
        verified = await one.audit.verify()
        assert verified.ok and verified.count == 36, verified
    entries = await chain(nats_url)
    titles = [e.data for e in entries if e.kind == "task.created"]
    assert len(titles) == len(set(titles)) == 30
    assert await outbox_rows(shared_url) == 0


# --- NATS unreachable: a server of the test's own, stopped and started again ------------------------------

BINARY = shutil.which("nats-server") or (
    "/usr/sbin/nats-server" if os.path.exists("/usr/sbin/nats-server") else None
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, root: Path) -> None:
        self.port, self.dir = _free_port(), root / "js"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.dir.mkdir(mode=0o700, exist_ok=True)
        self.proc = subprocess.Popen(
            [str(BINARY), "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                assert time.monotonic() < deadline, "nats-server did not start"
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    if BINARY is None:
        if IN_CI:
            pytest.fail("CI=true requires the nats-server binary (Debian's nats-server package)")
        pytest.skip("the nats-server binary is not installed")
    s = Server(tmp_path)
    s.start()
    try:
        yield s
    finally:
        s.stop()


async def _ready(url: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            nc = await nats.connect(url, connect_timeout=1, max_reconnect_attempts=0, allow_reconnect=False)
            try:
                await nc.jetstream().account_info()
                return
            finally:
                await nc.close()
        except Exception:
            assert time.monotonic() < deadline, "JetStream did not come up"
            await asyncio.sleep(0.05)


async def test_while_nats_is_unreachable_task_changes_commit_and_their_entries_wait_in_the_outbox(
    server: Server, tmp_path: Path
) -> None:
    base = f"nats://127.0.0.1:{server.port}"
    await _ready(base)
    url = f"{base}?prefix=down&timeout=1&rest=sqlite:///{tmp_path / 'state.db'}"
    store = await statekeel.open_store(url)
    try:
        task = await store.tasks.create("build", status="queued")
        server.stop()
        # The change commits in SQL; its entry waits in the outbox (the relay's failure is logged).
        claimed = await store.tasks.claim("w1")
        assert claimed is not None and claimed.id == task.id
        assert await outbox_rows(tmp_path) == 1
        with pytest.raises(statekeel.BackendUnavailable):
            await store.audit.verify()  # the chain cannot be read: never reported as verified
        server.start()
        await _ready(base)
        verified = await store.audit.verify()
        assert verified.ok and verified.count == 2 and verified.unrelayed == 0, verified
        assert [e.kind for e in await store.audit.query()] == ["task.created", "task.transitioned"]
    finally:
        await store.close()
        delete_nats_streams("down", base)
    assert await outbox_rows(tmp_path) == 0


async def test_verify_reports_entries_another_process_committed_and_has_not_relayed(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = paired(nats_url, tmp_path)
    async with statekeel.open_store(url) as store:
        await store.tasks.create("relayed")
    # Another process's change, committed in SQL, its relay not run yet.
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'state.db'}") as sql:
        sql.backend.audit_outbox = True  # type: ignore[attr-defined]
        await sql.tasks.create("waiting")
    async with statekeel.open_store(url) as store:
        verified = await store.audit.verify()  # the open relayed it
        assert verified.ok and verified.count == 2 and verified.unrelayed == 0
        from statekeel.backends.relay import AuditRelay

        async def no_relay(self: Any, **_: Any) -> int:
            return 0

        monkeypatch.setattr(AuditRelay, "run", no_relay)
        sql_backend: Any = store.backend.rest  # type: ignore[attr-defined]
        await sql_backend._write(_queue, "task.noted")
        verified = await store.audit.verify()
        assert verified.ok and verified.unrelayed == 1 and verified.oldest_unrelayed is not None


async def _queue(tx: Any, kind: str) -> None:
    from statekeel.backends.sql.audit import op_queue_audit

    await op_queue_audit(tx, kind, "me", "case", "{}")


async def test_a_block_whose_session_event_is_refused_rolls_its_sql_writes_and_entries_back(
    nats_url: str, tmp_path: Path
) -> None:
    async with statekeel.open_store(paired(nats_url, tmp_path)) as store:
        async with store.sessions.open("chat") as first:
            first.add_message("user", "first")
        stale = await store.sessions.load("chat")
        assert stale is not None
        async with (
            statekeel.open_store(paired(nats_url, tmp_path)) as other,
            other.sessions.open("chat") as fresh,
        ):
            fresh.add_message("user", "second")
        stale.add_message("user", "from a stale copy")
        with pytest.raises(statekeel.ConflictError):
            async with store.backend.atomic():
                await store.tasks.create("made with the stale turn")
                await store.audit.append("note", "me", "case", {"n": 1})
                await store.sessions.save(stale)
        assert (await store.tasks.list()).items == []
        assert await store.audit.query() == []
        loaded = await store.sessions.load("chat")
        assert loaded is not None and [m["content"] for m in loaded.messages] == ["first", "second"]
    assert await outbox_rows(tmp_path) == 0


async def test_erasing_a_subject_erases_its_sessions_on_nats_and_what_belongs_to_them_in_sql(
    nats_url: str, tmp_path: Path
) -> None:
    async with statekeel.open_store(paired(nats_url, tmp_path)) as store:
        for key, subject in (("alice-chat", "user:alice"), ("bob-chat", "user:bob")):
            async with store.sessions.open(key) as session:
                session.metadata["subject"] = subject
                session.add_message("user", f"I am {subject}")
            await store.memory.add_episode(key, f"{subject} said hello")
            await store.files.record(f"{key}.txt", "0" * 64, 1, session_key=key)
        report = await store.erase("user:alice", actor="dpo", reason="request #1")
        assert report.counts["sessions"] == 1 and report.counts["messages"] == 1, report.counts
        assert report.counts["episodes"] == 1 and report.counts["file_changes"] == 1, report.counts
        assert await store.sessions.load("alice-chat") is None
        assert await store.memory.episodes("alice-chat") == []
        assert [r.path for r in await store.files.list()] == ["bob-chat.txt"]
        bob = await store.sessions.load("bob-chat")
        assert bob is not None and len(await store.memory.episodes("bob-chat")) == 1
        assert [e.kind for e in await store.audit.query()] == ["erasure"]
        assert (await store.audit.verify()).ok
    async with statekeel.open_store(nats_url) as plain:
        assert await plain.sessions.load("alice-chat") is None
        assert await plain.sessions.load("bob-chat") is not None


async def test_a_backup_or_export_of_a_paired_store_is_refused_and_leaves_no_file(
    nats_url: str, tmp_path: Path
) -> None:
    async with statekeel.open_store(paired(nats_url, tmp_path)) as store:
        async with store.sessions.open("chat") as session:
            session.add_message("user", "hi")
        assert not store.holds("copy")
        with pytest.raises(statekeel.Unsupported, match=r"sessions, audit, traces of .* are on NATS"):
            await store.backup(tmp_path / "backup.db")
        assert not (tmp_path / "backup.db").exists()
        with pytest.raises(statekeel.Unsupported, match=r"sessions, audit, traces of .* are on NATS"):
            await statekeel.export_store(store, tmp_path / "export.jsonl")
        assert not (tmp_path / "export.jsonl").exists()
    async with statekeel.open_store(paired(nats_url, tmp_path, "kinds=traces")) as store:
        # The earlier pairing too: its spans are on NATS (an online backup of the SQL file alone, as
        # earlier releases took, left them out without a word).
        with pytest.raises(statekeel.Unsupported, match=r"traces of .* are on NATS"):
            await store.backup(tmp_path / "backup.db")
        assert not (tmp_path / "backup.db").exists()
