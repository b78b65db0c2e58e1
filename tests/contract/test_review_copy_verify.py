"""copy_store's verification compares rows, not only row counts.

A resumed copy continues after the last key the destination holds. Rows the source changed in the
meantime (a task that finished, a session whose status or metadata changed) sit before that key: they are
never copied again, the counts still match, and a count-only check reported the stale copy as verified.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import statekeel


def _url(tmp_path: Path, name: str) -> str:
    return f"sqlite:///{os.path.join(os.fspath(tmp_path), name)}"


class _Interrupted(Exception):
    pass


async def test_resume_after_the_source_changed_a_copied_row_is_not_reported_verified(
    tmp_path: Path,
) -> None:
    src_url, dst_url = _url(tmp_path, "src.db"), _url(tmp_path, "dst.db")
    async with statekeel.open_store(src_url) as src:
        task = await src.tasks.create("deploy")
        for i in range(5):
            session = await src.sessions.get_or_create(f"s{i}")
            session.add_message("user", f"m{i}")
            await src.sessions.save(session)

    def stop_in_messages(table: str, copied: int) -> None:
        if table == "messages":
            raise _Interrupted

    with pytest.raises(_Interrupted):
        await statekeel.copy_store(src_url, dst_url, batch_size=2, on_batch=stop_in_messages)

    # The source changes rows the destination already holds: same counts, other contents.
    async with statekeel.open_store(src_url) as src:
        await src.tasks.transition(task.id, "cancelled")
        await src.sessions.expire("s0")

    with pytest.raises(statekeel.ConflictError, match="differ") as info:
        await statekeel.copy_store(src_url, dst_url, batch_size=2, resume=True)
    assert info.value.table in ("sessions", "tasks")  # type: ignore[attr-defined]


async def test_copy_again_over_an_up_to_date_destination_is_verified_row_by_row(tmp_path: Path) -> None:
    src_url, dst_url = _url(tmp_path, "src.db"), _url(tmp_path, "dst.db")
    async with statekeel.open_store(src_url) as src:
        session = await src.sessions.get_or_create("s")
        session.add_message("user", {"n": 1.5, "nested": {"b": 1, "a": [None, True]}})
        await src.sessions.save(session)
        await src.audit.append("tool_call", "agent", "task-1", {"x": 1})
    first = await statekeel.copy_store(src_url, dst_url, batch_size=1)
    assert first.verified
    again = await statekeel.copy_store(src_url, dst_url, batch_size=1, resume=True)
    assert again.verified and again.copied == 0


@pytest.mark.postgres
async def test_rows_compare_equal_across_backends_despite_jsonb_formatting(
    tmp_path: Path, pg_migrated: str
) -> None:
    src_url = _url(tmp_path, "src.db")
    async with statekeel.open_store(src_url) as src:
        session = await src.sessions.get_or_create("s")
        session.add_message("user", {"zz": 1, "a": {"long key": [1, 2.5, "x"], "b": None}})
        await src.sessions.save(session)
        await src.tasks.create("t", metadata={"b": 2, "a": 1})
    report = await statekeel.copy_store(src_url, pg_migrated)
    assert report.verified
    again = await statekeel.copy_store(src_url, pg_migrated, resume=True)
    assert again.verified and again.copied == 0
