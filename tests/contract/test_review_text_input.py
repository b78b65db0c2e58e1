"""Review finding: free-text fields of tasks, workflows and approvals (title, description, workflow name,
decision reason) with NUL or a lone surrogate are refused with InvalidArgument before anything is
written, the same on every backend (SQLite used to store NUL that PostgreSQL refuses, and to raise a bare
UnicodeEncodeError for a surrogate)."""

from __future__ import annotations

import pytest

import statekeel

Store = statekeel.Store

BAD_TEXT = ["a\x00b", "a\ud800b"]


@pytest.mark.parametrize("text", BAD_TEXT, ids=["nul", "surrogate"])
async def test_task_and_workflow_text_with_nul_or_a_surrogate_is_refused_and_nothing_written(
    store: Store, text: str
) -> None:
    with pytest.raises(statekeel.InvalidArgument):
        await store.tasks.create(text)
    with pytest.raises(statekeel.InvalidArgument):
        await store.tasks.create("t", description=text)
    with pytest.raises(statekeel.InvalidArgument):
        await store.workflows.create(text, [{"name": "build"}])
    with pytest.raises(statekeel.InvalidArgument):
        await store.workflows.create("release", [{"name": "build", "title": text}])
    assert (await store.tasks.list()).items == []
    assert await store.workflows.list() == []
    # The store stays usable, and ordinary text (empty description included) still goes through.
    task = await store.tasks.create("é 🚀", description="")
    assert (task.title, task.description) == ("é 🚀", "")


@pytest.mark.parametrize("text", BAD_TEXT, ids=["nul", "surrogate"])
async def test_a_decision_reason_with_nul_or_a_surrogate_is_refused_and_nothing_written(
    store: Store, text: str
) -> None:
    approval = await store.approvals.request("task:1", "shell", {"cmd": "ls"}, "agent")
    before = await store.audit.verify()
    with pytest.raises(statekeel.InvalidArgument):
        await store.approvals.decide(approval.id, True, "alice", reason=text)
    assert await store.approvals.get(approval.id) == approval
    assert await store.audit.verify() == before
    granted = await store.approvals.decide(approval.id, True, "alice", reason="ok")
    assert granted.status == "granted" and granted.reason == "ok"
