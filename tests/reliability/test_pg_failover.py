"""PostgreSQL failover: kill -9 the primary of a real pg_auto_failover cluster under load, lose nothing.

The cluster (a monitor, a primary and a synchronous standby on loopback ports) is started by
``scripts/pg-ha``. Three worker processes (this file run as a script) write sessions, tasks, steps and
audit entries through a several-host URL (``target_session_attrs=read-write``) and log every write that
was acknowledged; two wait for the new primary (the default ``failover_timeout``), one fails fast
(``failover_timeout=0``) so that the errors callers see are exercised. The test kills the primary's keeper
and postmaster with SIGKILL, waits for the promotion, lets the workers write on, then checks on the new
primary that every acknowledged write is there exactly once, tasks are in legal states, the audit chain
verifies, and every worker wrote again after the promotion.

Needs ``pg_autoctl`` (Debian's postgresql-15-auto-failover) and root or the postgres user: with
``CI=true`` its absence fails the run, elsewhere the tests are skipped with the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import statekeel
from statekeel.backends.contract.store import every_item
from statekeel.tasks import TRANSITIONS

REPO = Path(__file__).resolve().parents[2]
PG_HA = REPO / "scripts" / "pg-ha"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
WORKERS = 3
ACKS_BEFORE_KILL = 15
ACKS_AFTER_PROMOTION = 10
PROMOTION_DEADLINE_S = 60.0
FENCE_WORKER = "fence-holder"
FENCE_SESSION = "fenced-session"
# One pytest-xdist worker runs the whole module: one cluster (its fixture is module-scoped), and no two
# workers scanning the same port range for one.
pytestmark = pytest.mark.xdist_group("pg_failover_cluster")


def _unavailable_reason() -> str | None:
    if shutil.which("pg_autoctl") is None:
        return "pg_autoctl is not installed (apt-get install postgresql-15-auto-failover)"
    if not Path("/usr/lib/postgresql/15/bin/pg_ctl").exists():
        return "PostgreSQL 15's server binaries are not installed"
    if os.geteuid() != 0:
        import pwd

        if pwd.getpwuid(os.geteuid()).pw_name != "postgres":
            return "pg_autoctl runs as the postgres user: run the tests as root or as postgres"
    return None


def _free_base_port() -> int:
    # Three consecutive free loopback ports (monitor, node1, node2).
    for base in range(55432, 56400, 7):
        ok = True
        for port in (base, base + 1, base + 2):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no three free consecutive ports in 55432-56400")


def _ha(*args: str, timeout: float = 180) -> str:
    out = subprocess.run([str(PG_HA), *args], capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"pg-ha {' '.join(args)} failed ({out.returncode}): {out.stderr}{out.stdout}")
    return out.stdout.strip()


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = _ha("start", str(root), str(_free_base_port()))
        _, self.node1, self.node2 = (int(p) for p in (root / "ports").read_text().split())

    def primary(self) -> tuple[str, int]:
        name, port, _pid = _ha("primary", str(self.root)).split()
        return name, int(port)

    def url_for(self, *ports: int, **options: str) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"postgresql://postgres@{hosts}/statekeel?{query}"

    def wait_for_new_primary(self, old: str) -> float:
        start = time.monotonic()
        while time.monotonic() - start < PROMOTION_DEADLINE_S:
            try:
                name, _ = self.primary()
                if name != old:
                    return time.monotonic() - start
            except RuntimeError:
                pass  # no primary reported yet
            time.sleep(0.2)
        raise AssertionError(f"no node was promoted within {PROMOTION_DEADLINE_S:g}s:\n{self.state()}")

    def state(self) -> str:
        return _ha("state", str(self.root))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    reason = _unavailable_reason()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"CI=true requires the failover cluster: {reason}")
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="statekeel-pg-ha-")) / "cluster"
    if os.geteuid() == 0:  # the keepers run as postgres: the private temp directory becomes theirs
        import pwd

        pg = pwd.getpwnam("postgres")
        os.chown(root.parent, pg.pw_uid, pg.pw_gid)
    try:
        c = Cluster(root)
    except BaseException:
        subprocess.run([str(PG_HA), "stop", str(root)], check=False, capture_output=True, timeout=120)
        shutil.rmtree(root.parent, ignore_errors=True)
        raise
    try:
        yield c
    finally:
        subprocess.run([str(PG_HA), "stop", str(root)], check=False, capture_output=True, timeout=120)
        shutil.rmtree(root.parent, ignore_errors=True)


# --- the worker (this file run as a script) ---------------------------------------------------------


async def _worker(url: str, proc: int, log_path: Path, stop: Path, fallback: Path) -> None:
    log = log_path.open("a", buffering=1)

    def note(**entry: Any) -> None:
        log.write(json.dumps(entry) + "\n")
        log.flush()
        os.fsync(log.fileno())

    async with statekeel.open_store(url, fallback_dir=str(fallback)) as store:
        sessions = [await store.sessions.get_or_create(f"w{proc}-s{j}") for j in range(3)]
        worker_id = f"worker-{proc}"
        i = 0
        while not await asyncio.to_thread(stop.exists):
            i += 1
            session = sessions[i % 3]
            content = f"w{proc}-m{i}"
            ops: list[tuple[str, Any]] = [
                ("msg", content),
                ("task", f"w{proc}-t{i}"),
                ("done", None),
                ("audit", i),
            ]
            for op, arg in ops:
                started = time.time()
                try:
                    if op == "msg":
                        session.add_message("user", arg)
                        await store.sessions.save(session)
                        # The backend took the save, or it went to the session's fallback file: both are
                        # acknowledged (recover() replays the file).
                        detail: dict[str, Any] = {
                            "key": session.key,
                            "content": arg,
                            "fallback": session.fallback_file is not None,
                        }
                    elif op == "task":
                        task = await store.tasks.create(arg, status="queued", idempotency_key=arg)
                        detail = {"task_id": task.id, "title": arg}
                    elif op == "done":  # claim the next queued task (anyone's), run its step, finish it
                        claimed = await store.tasks.claim(worker_id, lease_seconds=120)
                        detail = {}
                        if claimed is not None:
                            result = await store.tasks.step(
                                claimed.id, "s1", lambda: {"by": worker_id}, lease_epoch=claimed.lease_epoch
                            )
                            await store.tasks.transition(
                                claimed.id,
                                "success",
                                result=result,
                                worker_id=worker_id,
                                lease_epoch=claimed.lease_epoch,
                            )
                            detail["succeeded"] = claimed.id
                    else:
                        entry = await store.audit.append("load", worker_id, f"w{proc}", {"i": arg})
                        detail = {"seq": entry.seq, "hash": entry.hash}
                    note(op=op, ok=True, t0=started, t1=time.time(), **detail)
                except statekeel.StatekeelError as exc:
                    note(
                        op=op,
                        ok=False,
                        t0=started,
                        t1=time.time(),
                        error=type(exc).__name__,
                        message=str(exc)[:300],
                        outcome=getattr(exc, "outcome", None),
                        retry_after=getattr(exc, "retry_after", None),
                        pending=content if op == "msg" else None,
                    )
    log.close()


async def _fence_holder(url: str, log_path: Path, stop: Path, fallback: Path) -> None:
    """Holds a claimed task's lease and a session lock across the failover, renewing both, and saves the
    locked session; logs each heartbeat and save."""
    log = log_path.open("a", buffering=1)

    def note(**entry: Any) -> None:
        log.write(json.dumps(entry) + "\n")
        log.flush()
        os.fsync(log.fileno())

    async with statekeel.open_store(url, fallback_dir=str(fallback)) as store:
        task = await store.tasks.create("fenced", status="queued", idempotency_key="fenced")
        claimed = await store.tasks.claim(FENCE_WORKER, lease_seconds=120)
        assert claimed is not None and claimed.id == task.id, claimed
        async with store.sessions.open(FENCE_SESSION) as session:
            note(
                op="held", ok=True, t0=time.time(), t1=time.time(), task_id=task.id, epoch=claimed.lease_epoch
            )
            n = 0
            while not await asyncio.to_thread(stop.exists):
                n += 1
                started = time.time()
                try:
                    await store.tasks.heartbeat(task.id, FENCE_WORKER, claimed.lease_epoch, lease_seconds=120)
                    session.add_message("user", f"fenced-{n}")
                    await store.sessions.save(session)
                    note(
                        op="fence",
                        ok=True,
                        t0=started,
                        t1=time.time(),
                        fallback=session.fallback_file is not None,
                    )
                except statekeel.BackendUnavailable as exc:
                    note(
                        op="fence",
                        ok=False,
                        t0=started,
                        t1=time.time(),
                        error=type(exc).__name__,
                        outcome=getattr(exc, "outcome", None),
                        retry_after=getattr(exc, "retry_after", None),
                    )
                await asyncio.sleep(0.2)  # pacing: a renewal five times a second is plenty
    log.close()


async def _check_fence(url: str, task_id: str, epoch: int) -> None:
    """Another process, after the promotion: the session lock and the task's lease are still held."""
    async with statekeel.open_store(url) as other:
        with pytest.raises(statekeel.ConflictError):
            await other.sessions.lock(FENCE_SESSION).acquire(timeout=1)
        with pytest.raises(statekeel.LeaseLost):
            await other.tasks.heartbeat(task_id, "intruder", epoch)
        task = await other.tasks.get(task_id)
        assert (task.status, task.lease_epoch) == ("running", epoch)


# --- checks -----------------------------------------------------------------------------------------


def _read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _in_backend(entry: dict[str, Any]) -> bool:
    """An acknowledged write that the database took (not a save written to a fallback file)."""
    return bool(entry["ok"]) and not entry.get("fallback")


def _wait_for_acks(
    procs: list[subprocess.Popen[bytes]], logs: list[Path], after: float, count: int, deadline_s: float
) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        dead = [p for p, proc in enumerate(procs) if proc.poll() is not None]
        assert not dead, f"workers {dead} exited early"
        if all(
            sum(1 for e in _read_log(p) if _in_backend(e) and e["t0"] >= after) >= count
            for p in logs
            if p.exists()
        ) and all(p.exists() for p in logs):
            return
        time.sleep(0.2)
    raise AssertionError(f"the workers did not reach {count} acknowledged writes after {after}")


def _start_worker(tmp: Path, mode: str, url: str, p: int, stop: Path) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp / f"worker-{p}.jsonl"
    with (tmp / f"worker-{p}.err").open("wb") as err:  # the child keeps its own copy of the fd
        args = [mode, url, str(log), str(stop), str(tmp / f"fallback-{p}")]
        return subprocess.Popen([sys.executable, __file__, *args], stderr=err), log


def _stop_workers(procs: list[subprocess.Popen[bytes]], stop: Path, tmp: Path) -> None:
    stop.touch()
    for p, proc in enumerate(procs):
        try:
            rc = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"worker {p} hung after the stop signal") from None
        err = (tmp / f"worker-{p}.err").read_text()
        assert rc == 0, f"worker {p} exited {rc}: {err[-3000:]}"


async def _check_store(url: str, entries: list[dict[str, Any]], fallback_dirs: list[Path]) -> None:
    # Saves that went to a fallback file while no primary answered are replayed first (invariant 10).
    for fallback in fallback_dirs:
        async with statekeel.open_store(url, fallback_dir=str(fallback)) as replayer:
            await replayer.recover()
    async with statekeel.open_store(url) as store:
        by_key: dict[str, list[str]] = {}
        for e in entries:
            if e["op"] == "msg" and e["ok"]:
                by_key.setdefault(e["key"], []).append(e["content"])
        for key, acked in by_key.items():
            session = await store.sessions.load(key, repair=False)
            assert session is not None, f"session {key} is gone"
            stored = [m["content"] for m in session.messages]
            counts = Counter(stored)
            doubled = [c for c, n in counts.items() if n > 1]
            assert not doubled, f"{key}: messages stored twice: {doubled[:5]}"
            missing = [c for c in acked if c not in counts]
            assert not missing, f"{key}: acknowledged messages lost: {missing[:5]}"
            # Transcript order is the order of the saves (one writer per session).
            assert stored == sorted(stored, key=lambda c: int(c.rsplit("m", 1)[1]))
        for e in entries:
            if e["op"] == "task" and e["ok"]:
                task = await store.tasks.get(e["task_id"])
                assert task.title == e["title"]
            if e["op"] == "done" and e["ok"] and "succeeded" in e:
                done = await store.tasks.get(e["succeeded"])
                assert done.status == "success"
                steps = await store.tasks.steps(done.id)
                assert [s.status for s in steps] == ["succeeded"]
        # Every task got where it is by legal transitions, each recorded once (invariant 5): its audit
        # entries, in chain order, walk from its creation to its current status and version.
        trail: dict[str, list[Any]] = {}
        async for entry in _audit_entries(store):
            if entry.subject.startswith("task:"):
                trail.setdefault(entry.subject[5:], []).append(entry)
        async for task in every_item(lambda cursor: store.tasks.list(limit=500, cursor=cursor)):
            entries_of = trail.get(task.id, [])
            assert entries_of and entries_of[0].kind == "task.created", task.id
            status, version = entries_of[0].data["status"], entries_of[0].data["version"]
            for entry in entries_of[1:]:
                if entry.kind != "task.transitioned":
                    continue  # step entries
                data = entry.data
                assert data["from"] == status and data["to"] in TRANSITIONS[status], (task.id, data)
                assert data["version"] > version, (task.id, data)
                status, version = data["to"], data["version"]
            assert (task.status, task.version) == (status, version), task
        audited = {e["seq"]: e["hash"] for e in entries if e["op"] == "audit" and e["ok"]}
        stored_audit = {a.seq: a.hash async for a in _audit_entries(store) if a.kind == "load"}
        lost = {seq for seq, h in audited.items() if stored_audit.get(seq) != h}
        assert not lost, f"acknowledged audit entries lost or changed: {sorted(lost)[:5]}"
        verification = await store.audit.verify()
        assert verification.ok, verification


async def _audit_entries(store: statekeel.Store) -> AsyncIterator[Any]:
    after = 0
    while batch := await store.audit.query(limit=500, after_seq=after):
        for entry in batch:
            yield entry
        after = batch[-1].seq


def _summary(entries_by_worker: list[list[dict[str, Any]]], killed_at: float) -> dict[str, Any]:
    windows = []
    errors: Counter[str] = Counter()
    longest_call = 0.0
    fallback_saves = 0
    for entries in entries_by_worker:
        # The window of one worker: from the kill to the end of its first write, begun after the kill,
        # that the database acknowledged.
        resumed = min(e["t1"] for e in entries if _in_backend(e) and e["t0"] >= killed_at)
        windows.append(resumed - killed_at)
        for e in entries:
            fallback_saves += bool(e.get("fallback"))
            longest_call = max(longest_call, e["t1"] - e["t0"])
            if not e["ok"]:
                errors[f"{e['error']}(outcome={e['outcome']}, retry_after={e['retry_after']})"] += 1
    return {
        "window_p50_s": round(statistics.median(windows), 2),
        "window_max_s": round(max(windows), 2),
        "longest_call_s": round(longest_call, 2),
        "errors": dict(errors),
        "saves_to_fallback_files": fallback_saves,
        "writes": sum(len(es) for es in entries_by_worker),
    }


def test_acknowledged_writes_survive_kill9_of_the_primary(cluster: Cluster, tmp_path: Path) -> None:
    old, _ = cluster.primary()
    waiting = cluster.url_for(cluster.node1, cluster.node2, target_session_attrs="read-write")
    fast = cluster.url_for(
        cluster.node1, cluster.node2, target_session_attrs="read-write", failover_timeout="0"
    )
    stop = tmp_path / "stop"
    fence, fence_log = _start_worker(tmp_path, "fence", waiting, WORKERS, stop)
    procs, logs = [fence], [fence_log]
    try:
        _wait_for_acks(procs, logs, 0.0, 1, 60)  # the fence holder holds its lease and lock
        for p, url in enumerate([waiting, waiting, fast]):
            proc, log = _start_worker(tmp_path, str(p), url, p, stop)
            procs.insert(p, proc)
            logs.insert(p, log)
        _wait_for_acks(procs, logs, 0.0, ACKS_BEFORE_KILL, 120)
        _ha("kill", str(cluster.root), old)
        killed_at = time.time()  # SIGKILL sent: a write begun before this may still have landed
        promotion_s = cluster.wait_for_new_primary(old)
        promoted_at = time.time()
        _wait_for_acks(procs, logs, promoted_at, ACKS_AFTER_PROMOTION, 90)
        held = _read_log(fence_log)[0]
        # Fencing across the switch: the holder still holds the session lock and the task's lease.
        asyncio.run(_check_fence(waiting, held["task_id"], held["epoch"]))
    finally:
        _stop_workers(procs, stop, tmp_path)
    entries_by_worker = [_read_log(p) for p in logs[:WORKERS]]
    fence_entries = _read_log(fence_log)
    # The holder renewed its lease and saved its locked session on the new primary.
    assert any(_in_backend(e) and e["t0"] >= promoted_at for e in fence_entries if e["op"] == "fence")
    summary = _summary([*entries_by_worker, fence_entries], killed_at)
    summary["promotion_s"] = round(promotion_s, 2)
    print(f"\nfailover: {json.dumps(summary)}")  # the figures docs/scale.md quotes
    # Never a hang: no call took longer than failover_timeout (10 s) plus one round of connection
    # attempts to both hosts.
    assert summary["longest_call_s"] < 25, summary
    # What callers saw while there was no primary: BackendUnavailable only, each either a retry hint
    # (nothing was written) or an unknown outcome (a COMMIT whose answer was lost).
    for entries in entries_by_worker:
        for e in entries:
            if not e["ok"]:
                assert e["error"] == "BackendUnavailable", e
                assert e["retry_after"] is not None or e["outcome"] == "unknown", e
                assert e["t1"] >= killed_at - 1, f"a call failed before the kill: {e}"
    entries = [e for es in entries_by_worker for e in es]
    asyncio.run(_check_store(waiting, entries, [tmp_path / f"fallback-{p}" for p in range(WORKERS + 1)]))

    # The killed node comes back: its keeper rejoins it as a standby of the new primary, so a URL that
    # lists it first still writes to the new primary (target_session_attrs=read-write refuses it).
    _ha("revive", str(cluster.root), old)
    _ha("wait", str(cluster.root), "90")
    new, new_port = cluster.primary()
    assert new != old
    old_port = cluster.node1 if old == "node1" else cluster.node2
    asyncio.run(
        _writes_reach(cluster.url_for(old_port, new_port, target_session_attrs="read-write"), new_port)
    )


async def _writes_reach(url: str, port: int) -> None:
    async with statekeel.open_store(url) as store:
        session = await store.sessions.get_or_create("after-rejoin")
        session.add_message("user", "still here")
        await store.sessions.save(session)
        assert session.fallback_file is None  # the backend took it
        assert await store.backend.pool.fetchval("SELECT inet_server_port()") == port  # type: ignore[attr-defined]
        assert not await store.backend.pool.fetchval("SELECT pg_is_in_recovery()")  # type: ignore[attr-defined]


def test_url_whose_hosts_are_all_standbys_names_them(cluster: Cluster) -> None:
    _, primary = cluster.primary()
    standby = cluster.node2 if primary == cluster.node1 else cluster.node1
    url = cluster.url_for(
        standby, standby, target_session_attrs="read-write", failover_timeout="1", connect_timeout="2"
    )

    async def go() -> None:
        started = time.monotonic()
        with pytest.raises(statekeel.BackendUnavailable) as info:
            await statekeel.open_store(url)
        assert time.monotonic() - started < 10  # bounded by failover_timeout, never a hang
        assert f"127.0.0.1:{standby}" in str(info.value)
        assert "standby" in str(info.value)
        assert info.value.retry_after > 0  # type: ignore[attr-defined]

    asyncio.run(go())


def test_prefer_standby_store_reads_on_a_standby_and_refuses_writes(cluster: Cluster) -> None:
    _, primary = cluster.primary()
    standby = cluster.node2 if primary == cluster.node1 else cluster.node1

    async def go() -> None:
        async with statekeel.open_store(cluster.url_for(primary, target_session_attrs="read-write")) as rw:
            s = await rw.sessions.get_or_create("read-on-standby")
            s.add_message("user", "replicated")
            await rw.sessions.save(s)
        url = cluster.url_for(primary, standby, target_session_attrs="prefer-standby")
        async with statekeel.open_store(url, fallback_dir=tempfile.mkdtemp()) as ro:
            assert await ro.backend.pool.fetchval("SELECT inet_server_port()") == standby  # type: ignore[attr-defined]
            # Synchronous replication (remote_apply is not on): the standby has the row once it is
            # flushed there; it is applied within moments.
            for _ in range(50):
                loaded = await ro.sessions.load("read-on-standby", repair=False)
                if loaded is not None and loaded.messages:
                    break
                await asyncio.sleep(0.1)
            assert loaded is not None and [m["content"] for m in loaded.messages] == ["replicated"]
            with pytest.raises(statekeel.BackendUnavailable, match="reads only"):
                await ro.tasks.create("nope")
            assert all(t.title != "nope" for t in (await ro.tasks.list(limit=500)).items)

    asyncio.run(go())
    # The command line's read-only commands work on the standby too.
    from click.testing import CliRunner

    from statekeel.cli import main

    url = cluster.url_for(standby, target_session_attrs="prefer-standby")
    shown = CliRunner().invoke(main, ["--db", url, "show", "read-on-standby"])
    assert shown.exit_code == 0, shown.output
    assert "replicated" in shown.output


def test_writes_continue_while_the_monitor_is_down(cluster: Cluster) -> None:
    _ha("monitor-stop", str(cluster.root))
    try:

        async def go() -> None:
            url = cluster.url_for(cluster.node1, cluster.node2, target_session_attrs="read-write")
            async with statekeel.open_store(url) as store:
                for n in range(5):
                    task = await store.tasks.create(f"monitor-down-{n}")
                    assert (await store.tasks.get(task.id)).status == "pending"
                s = await store.sessions.get_or_create("monitor-down")
                s.add_message("user", "written without a monitor")
                await store.sessions.save(s)
                assert s.fallback_file is None  # the backend took it

        asyncio.run(go())
    finally:
        _ha("monitor-start", str(cluster.root))
        _ha("wait", str(cluster.root), "60")


# --- a demoted server, forced with a hook (the shared server; no cluster needed) ---------------------


def _refuse_first_write(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first statement of the next write fails as on a server demoted to standby; returns the list
    the hook appends each refused call to."""
    import asyncpg

    from statekeel.backends.postgres.backend import PgTx

    refused: list[int] = []
    original = PgTx.fetchone

    async def fetchone(self: PgTx, name: str, *args: Any) -> Any:
        if not refused:
            refused.append(1)
            raise asyncpg.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction")
        return await original(self, name, *args)

    monkeypatch.setattr(PgTx, "fetchone", fetchone)
    return refused


async def test_failover_write_refused_by_a_demoted_server_runs_again_once(
    pg_migrated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = pg_migrated + ("&" if "?" in pg_migrated else "?") + "target_session_attrs=read-write"
    async with statekeel.open_store(url) as store:
        refused = _refuse_first_write(monkeypatch)
        task = await store.tasks.create("after-demotion", idempotency_key="after-demotion")
        assert refused == [1]  # the hook did refuse the first try
        monkeypatch.undo()
        page = await store.tasks.list(limit=500)
        assert [t.id for t in page.items if t.title == "after-demotion"] == [task.id]  # once, not twice
        entries = await store.audit.query(subject=f"task:{task.id}")
        assert len(entries) == 1 and (await store.audit.verify()).ok


async def test_failover_read_only_store_refuses_a_write_without_retrying(
    pg_migrated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = pg_migrated + ("&" if "?" in pg_migrated else "?") + "target_session_attrs=prefer-standby"
    async with statekeel.open_store(url) as store:
        refused = _refuse_first_write(monkeypatch)
        with pytest.raises(statekeel.BackendUnavailable, match="reads only") as info:
            await store.tasks.create("refused")
        assert info.value.retry_after is None  # type: ignore[attr-defined]
        monkeypatch.undo()
        assert refused == [1]
        assert all(t.title != "refused" for t in (await store.tasks.list(limit=500)).items)


if __name__ == "__main__":
    mode_arg, url_arg, *paths = sys.argv[1:]
    log_arg, stop_arg, fallback_arg = (Path(p) for p in paths)
    if mode_arg == "fence":
        asyncio.run(_fence_holder(url_arg, log_arg, stop_arg, fallback_arg))
    else:
        asyncio.run(_worker(url_arg, int(mode_arg), log_arg, stop_arg, fallback_arg))
