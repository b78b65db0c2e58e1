"""Tasks: a state machine with conditional transitions, leases with fencing, and a step journal
(:class:`TaskManager`, ``store.tasks``). ``manager.py`` holds the manager, ``steps.py`` the step journal,
``operations.py`` what an operator does to tasks (resolve, requeue, cancel), ``rules.py`` what all three
share (statuses, transitions, the clock, the audit entries); each imports only the modules below it."""

from __future__ import annotations

from .manager import TaskManager
from .rules import (
    FINISHED,
    LEASE_EXPIRY_ACTOR,
    MAX_LEASE_SECONDS,
    MAX_RETRY_AFTER,
    TRANSITIONS,
    UNSPECIFIED_ACTOR,
    Task,
    backoff,
    check_lease_seconds,
    check_not_before,
    check_status,
    created_note,
    new_task,
    plan_transition,
    task_note,
    transition_note,
)
from .steps import TaskStep, check_step_args

__all__ = [
    "FINISHED",
    "LEASE_EXPIRY_ACTOR",
    "MAX_LEASE_SECONDS",
    "MAX_RETRY_AFTER",
    "TRANSITIONS",
    "UNSPECIFIED_ACTOR",
    "Task",
    "TaskManager",
    "TaskStep",
    "backoff",
    "check_lease_seconds",
    "check_not_before",
    "check_status",
    "check_step_args",
    "created_note",
    "new_task",
    "plan_transition",
    "task_note",
    "transition_note",
]
