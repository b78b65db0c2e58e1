"""The MariaDB server restarted under an open store: calls during the outage raise BackendUnavailable
naming the server, and once it is back the same store goes on — no restart of the agent, no write lost
or doubled.

This test stops the shared MariaDB server (127.0.0.1:3306) and starts it again, waiting until it answers;
it runs only where that server is this test run's own (``STATEKEEL_TEST_MARIADB_RESTART=1``, set by
``.ci/run``) and the process may start it (root).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess

import pytest

import statekeel
from helpers import mariadb_raw

pytestmark = pytest.mark.skipif(
    os.environ.get("STATEKEEL_TEST_MARIADB_RESTART") != "1" or os.geteuid() != 0,
    reason="restarts the MariaDB server: needs STATEKEEL_TEST_MARIADB_RESTART=1 and root",
)


def _answers() -> bool:
    done = subprocess.run(
        ["mysqladmin", "-h", "127.0.0.1", "-P", "3306", "-u", "root", "ping"], capture_output=True, timeout=10
    )
    return done.returncode == 0


async def _wait(up: bool) -> None:
    for _ in range(600):
        if await asyncio.to_thread(_answers) == up:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the MariaDB server did not {'come back' if up else 'stop'} within a minute")


def _start() -> None:
    daemon = shutil.which("start-stop-daemon") or "/sbin/start-stop-daemon"
    subprocess.run(
        [daemon, "--start", "--oknodo", "--background", "--exec", "/usr/sbin/mariadbd"],
        check=True,
        timeout=30,
    )


async def test_a_store_goes_on_after_the_server_restarted_and_loses_no_write(my_migrated: str) -> None:
    async with statekeel.open_store(my_migrated + "?connect_timeout=2") as store:
        async with store.sessions.open("s") as session:
            session.add_message("user", "before")
        await store.tasks.create("t1")
        subprocess.run(
            ["mysqladmin", "-h", "127.0.0.1", "-u", "root", "shutdown"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        try:
            await _wait(up=False)
            with pytest.raises(statekeel.BackendUnavailable) as info:
                await store.tasks.create("during the outage")
            assert info.value.fields["host"] == "127.0.0.1"
            with pytest.raises(statekeel.BackendUnavailable):
                await store.tasks.list()
        finally:
            await asyncio.to_thread(_start)
            await _wait(up=True)
        # The same store, its dead connections replaced.
        await store.tasks.create("t2")
        async with store.sessions.open("s") as session:
            session.add_message("user", "after")
        assert [t.title for t in (await store.tasks.list()).items] == ["t1", "t2"]
    assert await mariadb_raw(my_migrated, "SELECT count(*) FROM messages") == [(2,)]
