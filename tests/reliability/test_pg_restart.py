"""A real PostgreSQL restart in the middle of a run: writes fail with BackendUnavailable (sessions fall back
to files), the pool reconnects by itself once the server is back, and nothing acknowledged is lost.

This stops the shared test server for a few seconds, which would break tests that other people run
against it at the same time: it runs under ``CI=true`` (CI has the machine to itself) or with
``STATEKEEL_TEST_PG_RESTART=1``, and is skipped otherwise. The server is started again in any case, even
when the test fails.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from typing import Any

import pytest

import statekeel
from statekeel.backends.base import NewMessage

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.stops_shared_server]

_ALLOWED = any(
    os.environ.get(name, "").lower() in ("1", "true", "yes") for name in ("CI", "STATEKEEL_TEST_PG_RESTART")
)


def _cluster_version() -> str | None:
    if shutil.which("pg_ctlcluster") is None or not os.path.isdir("/etc/postgresql"):
        return None
    versions = sorted(os.listdir("/etc/postgresql"))
    return versions[-1] if versions else None


def _ctl(action: str, *extra: str) -> None:
    version = _cluster_version()
    assert version is not None
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action, *extra],
        check=True,
        timeout=120,
        capture_output=True,
    )


def _server_ready() -> bool:
    return subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-q"], check=False).returncode == 0


def _ensure_running() -> None:
    if not _server_ready():
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", _cluster_version() or "", "main", "start"],
            check=False,
            timeout=120,
            capture_output=True,
        )
    deadline = time.monotonic() + 60
    while not _server_ready():
        if time.monotonic() > deadline:
            raise RuntimeError("PostgreSQL did not come back within 60s")
        time.sleep(0.2)


def _files(path: str) -> list[str]:
    return os.listdir(path) if os.path.isdir(path) else []


def _turn(store: statekeel.Store, n: int) -> list[NewMessage]:
    return [
        NewMessage("user", store.codec.encode({"role": "user", "content": f"turn-{n}"})),
        NewMessage("assistant", store.codec.encode({"role": "assistant", "content": f"answer-{n}"})),
    ]


async def _until(condition: Any, what: str, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"{what}: not within {deadline_s}s")
        await asyncio.sleep(0.05)


async def test_server_restart_mid_run_loses_nothing_acknowledged_and_the_pool_reconnects(
    pg_migrated: str, tmp_path: Any
) -> None:
    if not _ALLOWED:
        pytest.skip("restarts the shared PostgreSQL server: set STATEKEEL_TEST_PG_RESTART=1 (CI=true does)")
    if _cluster_version() is None:
        pytest.skip("pg_ctlcluster is not available here: cannot restart the server")
    fallback_dir = os.path.join(os.fspath(tmp_path), "fallback")
    store = await statekeel.open_store(
        pg_migrated + "?pool_min_size=2&pool_max_size=4&connect_timeout=2", fallback_dir=fallback_dir
    )
    b = store.backend
    acked: list[int] = []  # turns whose append returned
    unknown: list[int] = []  # turns whose COMMIT outcome was unknown
    failures: list[statekeel.BackendUnavailable] = []
    saved = 0  # session saves that returned (to the backend or to a fallback file)
    stop = asyncio.Event()
    session = await store.sessions.get_or_create("agent")

    async def writer() -> None:
        nonlocal saved
        n, head = 0, 0
        while not stop.is_set():
            try:
                if head < 0:
                    rec = await b.load_session("s")
                    head = 0 if rec is None else rec.head_seq
                rec = await b.append_messages("s", head, _turn(store, n), create=True)
                acked.append(n)
                head, n = rec.head_seq, n + 1
            except statekeel.BackendUnavailable as exc:
                failures.append(exc)
                if getattr(exc, "outcome", None) == "unknown":
                    unknown.append(n)
                    n += 1  # a fresh turn id, so a possibly applied one is never written twice
                head = -1
                await asyncio.sleep(0.05)
            # The same turn through the session manager: it falls back to a file when the server is down.
            session.add_message("user", f"s-turn-{saved}")
            await store.sessions.save(session)
            saved += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(writer())
    try:
        await _until(lambda: len(acked) >= 5, "first acknowledged turns", 30)
        await asyncio.to_thread(_ctl, "stop", "-m", "fast")
        await _until(lambda: len(failures) >= 3, "failures while down", 30)
        await _until(lambda: bool(_files(fallback_dir)), "a session fallback file", 30)
        acked_while_down, failed_while_down = len(acked), len(failures)
        # Three more attempts of the writer, each refused, while the server is still down: nothing is
        # acknowledged in between (waited for by the attempts made, not by a pause).
        await _until(lambda: len(failures) >= failed_while_down + 3, "more failures while down", 30)
        assert len(acked) == acked_while_down  # nothing is acknowledged while the server is down
        await asyncio.to_thread(_ctl, "start")
        # The pool reconnects by itself: the same store acknowledges new turns.
        await _until(lambda: len(acked) >= acked_while_down + 5, "turns after the restart", 60)
    finally:
        await asyncio.to_thread(_ensure_running)  # first: other tests need the server whatever happened
        stop.set()
        await asyncio.wait_for(task, timeout=60)

    assert all(isinstance(f, statekeel.BackendUnavailable) for f in failures)
    assert all("127.0.0.1" in str(f) for f in failures)
    report = await store.sessions.replay_fallback()
    assert not report.failed and not report.quarantined
    await store.close()

    async with statekeel.open_store(pg_migrated) as fresh:
        messages = await fresh.backend.read_messages("s")
        assert [m.seq for m in messages] == list(range(len(messages)))  # dense
        turns = [int(m.payload["content"].split("-")[1]) for m in messages if m.role == "user"]
        assert len(turns) == len(set(turns))  # no duplicates
        assert turns == sorted(turns)
        assert set(acked) <= set(turns)  # nothing acknowledged is lost
        assert set(turns) <= set(acked) | set(unknown)  # nothing that was refused appears
        for i in range(0, len(messages), 2):  # each turn's two messages are contiguous
            assert messages[i + 1].payload["content"] == messages[i].payload["content"].replace(
                "turn", "answer"
            )
        loaded = await fresh.sessions.load("agent")
        assert loaded is not None
        assert [m["content"] for m in loaded.messages] == [f"s-turn-{i}" for i in range(saved)]
    assert not _files(fallback_dir)  # replayed, then removed
