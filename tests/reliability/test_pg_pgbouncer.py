"""``?pgbouncer=true`` behind a real PgBouncer in transaction pooling mode: migrations, every kind of
operation and many concurrent clients multiplexed over fewer server connections.

Needs the ``pgbouncer`` binary (Debian package ``pgbouncer``, which ``.ci/run`` installs); without it
they fail under ``CI=true`` and are skipped with the reason elsewhere. PgBouncer refuses to run as
root, so as root it runs as the ``postgres`` user.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

import statekeel
from conftest import IN_CI
from helpers import message

pytestmark = pytest.mark.postgres

_BINARY = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _required_binary(binary: str | None, in_ci: bool) -> str:
    """The pgbouncer binary; without one, a failure under CI=true (.ci/run installs it), else a skip."""
    if binary is None:
        reason = "pgbouncer is not installed (apt-get install pgbouncer)"
        if in_ci:
            pytest.fail(f"CI=true requires PgBouncer (.ci/run installs it): {reason}")
        pytest.skip(reason)
    return binary


def test_a_missing_pgbouncer_fails_under_ci_and_skips_elsewhere() -> None:
    with pytest.raises(pytest.fail.Exception, match="CI=true requires PgBouncer"):
        _required_binary(None, in_ci=True)
    with pytest.raises(pytest.skip.Exception, match="pgbouncer is not installed"):
        _required_binary(None, in_ci=False)
    assert _required_binary("/usr/sbin/pgbouncer", in_ci=True) == "/usr/sbin/pgbouncer"


@pytest.fixture
def pgbouncer(pg_database: str) -> Iterator[str]:
    """A PgBouncer (transaction pooling, 3 server connections) in front of the test server; its base URL."""
    binary = _required_binary(_BINARY, IN_CI)
    server = pg_database.rsplit("/", 1)[0].split("@", 1)[1]  # host:port of the test server
    host, _, port = server.partition(":")
    listen = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="sk-pgbouncer-"))
    as_postgres = os.geteuid() == 0
    (workdir / "userlist.txt").write_text('"postgres" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={host} port={port or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {workdir}/userlist.txt\n"
        "pool_mode = transaction\ndefault_pool_size = 3\nmax_client_conn = 200\n"
        f"logfile = {workdir}/pgbouncer.log\npidfile = {workdir}/pgbouncer.pid\n"
        "ignore_startup_parameters = extra_float_digits\n"
    )
    if as_postgres:
        shutil.chown(workdir, "postgres")
        for f in workdir.iterdir():
            shutil.chown(f, "postgres")
    cmd = [binary, str(workdir / "pgbouncer.ini")]
    if as_postgres:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", listen), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > end:
                    log = (
                        (workdir / "pgbouncer.log").read_text()
                        if (workdir / "pgbouncer.log").exists()
                        else ""
                    )
                    pytest.fail(
                        f"pgbouncer did not start: {proc.stderr.read() if proc.stderr else b''!r} {log}"
                    )
                time.sleep(0.05)
        user = pg_database.split("://", 1)[1].split("@", 1)[0]
        yield f"postgresql://{user}@127.0.0.1:{listen}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


async def test_store_works_behind_pgbouncer_transaction_pooling(pgbouncer: str, pg_database: str) -> None:
    db = pg_database.rsplit("/", 1)[1]
    url = f"{pgbouncer}/{db}?pgbouncer=true&pool_max_size=12"
    # A fresh database: the migrations run through PgBouncer too.
    async with statekeel.open_store(url) as store:
        b = store.backend
        assert await b.schema_version() >= 2
        assert await b.integrity_check() == []
        # 12 client connections over 3 server connections, each op a transaction of several statements.

        async def writer(i: int) -> None:
            head = 0
            for t in range(10):
                head = (
                    await b.append_messages(f"s{i}", head, [message(store, f"{i}-{t}")] * 2, create=True)
                ).head_seq
                loaded = await b.load_session_with_messages(f"s{i}")
                assert loaded is not None and loaded[0].head_seq == head

        await asyncio.gather(*(writer(i) for i in range(24)))
        await b.archive_messages("s0", compression_id="c", upto_seq=4, summary="sum", expected_consolidated=0)
        async with b.atomic():
            await b.append_messages("s1", 20, [message(store, "atomic")])
            await b.update_session("s1", status="expired")
        with pytest.raises(statekeel.ConflictError):
            await b.append_messages("s2", 0, [message(store, "stale")])
    # Reopened (migrations are current), everything is there.
    async with statekeel.open_store(url) as store:
        page = await store.backend.list_sessions(limit=100)
        assert len(page.items) == 24
        for i in range(1, 24):
            msgs = await store.backend.read_messages(f"s{i}")
            assert [m.seq for m in msgs] == list(range(len(msgs)))
            assert len(msgs) == (21 if i == 1 else 20)
        assert len(await store.backend.read_archive("s0")) == 4
    # No session-level state was left on the server connections PgBouncer shares between clients.
    direct = await asyncpg.connect(pg_database)
    try:
        assert await direct.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0
    finally:
        await direct.close()


async def test_concurrent_first_opens_behind_pgbouncer_migrate_exactly_once(
    pgbouncer: str, pg_database: str
) -> None:
    # Four processes' worth of stores racing to migrate a fresh database through PgBouncer: the
    # advisory lock must hold for each migration's whole transaction, whichever server connection runs it.
    db = pg_database.rsplit("/", 1)[1]
    url = f"{pgbouncer}/{db}?pgbouncer=true&pool_min_size=1&pool_max_size=2"
    for _ in range(3):
        stores = await asyncio.gather(*(statekeel.open_store(url) for _ in range(6)))
        for store in stores:
            await store.close()
    direct = await asyncpg.connect(pg_database)
    try:
        versions = [
            r[0] for r in await direct.fetch("SELECT version FROM schema_migrations ORDER BY version")
        ]
        assert versions == list(range(1, len(versions) + 1)) and len(versions) >= 4
        assert await direct.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0
    finally:
        await direct.close()
