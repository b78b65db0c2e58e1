"""``statekeel schedules list|pause|resume|delete|next`` as an operator runs them: subprocesses against a
store on SQLite, PostgreSQL and MariaDB; the change, its audit entry naming the actor, and the refusals
(one line, exit 1, nothing written)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import statekeel
from helpers import one_line_error, run_statekeel


def _on(url: str, what: Any) -> Any:
    async def go() -> Any:
        async with statekeel.open_store(url) as store:
            return await what(store)

    return asyncio.run(go())


def sk(url: str, tmp_path: Path, *args: str) -> Any:
    return run_statekeel(*args, "--db", url, cwd=tmp_path, env={"USER": "ops"})


def test_schedules_list_pause_resume_next_and_delete_act_with_their_audit_entries(
    shared_url: str, tmp_path: Path
) -> None:
    _on(shared_url, lambda s: s.schedules.create("nightly", cron="0 3 * * *", timezone="Europe/Berlin",
                                                 task="rebuild the index"))  # fmt: skip
    listed = sk(shared_url, tmp_path, "schedules", "list")
    assert listed.returncode == 0, listed.stderr
    assert "nightly" in listed.stdout and "0 3 * * *" in listed.stdout and "1 schedule" in listed.stdout
    [row] = json.loads(sk(shared_url, tmp_path, "schedules", "list", "--json").stdout)
    assert (row["name"], row["paused"]) == ("nightly", False)

    upcoming = sk(shared_url, tmp_path, "schedules", "next", "nightly", "-n", "3")
    assert upcoming.returncode == 0, upcoming.stderr
    fires = upcoming.stdout.split()
    assert len(fires) == 3 and all("T03:00:00+0" in f for f in fires)

    paused = sk(shared_url, tmp_path, "schedules", "pause", "nightly", "--actor", "alice")
    assert paused.returncode == 0 and "paused (by alice)" in paused.stdout
    assert _on(shared_url, lambda s: s.schedules.get("nightly")).paused
    assert "paused: no slot fires" in sk(shared_url, tmp_path, "schedules", "next", "nightly").stdout
    resumed = sk(shared_url, tmp_path, "schedules", "resume", "nightly")
    assert resumed.returncode == 0 and "(by ops)" in resumed.stdout

    deleted = sk(shared_url, tmp_path, "schedules", "delete", "nightly", "--actor", "bob")
    assert deleted.returncode == 0 and "deleted (by bob)" in deleted.stdout
    entries = _on(shared_url, lambda s: s.audit.query(subject="schedule:nightly"))
    assert [(e.kind, e.actor) for e in entries] == [
        ("schedule.created", "unspecified"),
        ("schedule.paused", "alice"),
        ("schedule.resumed", "ops"),
        ("schedule.deleted", "bob"),
    ]
    assert "no schedules" in sk(shared_url, tmp_path, "schedules", "list").stdout


def test_an_action_on_a_missing_schedule_is_one_line_and_exit_1(shared_url: str, tmp_path: Path) -> None:
    _on(shared_url, lambda s: s.schedules.create("kept", every=60, task="t"))
    for verb in ("pause", "resume", "delete", "next"):
        result = sk(shared_url, tmp_path, "schedules", verb, "nope")
        assert "does not exist" in one_line_error(result) and result.returncode == 1, verb
    assert [s.name for s in _on(shared_url, lambda s: s.schedules.list()).items] == ["kept"]
