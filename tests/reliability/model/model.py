"""The promises, as plain Python: what a caller of statekeel may observe after each operation.

Nothing here touches a store. Each class holds what the promises say the store holds, and each method
is one operation's promise. Where the promise is "either, until settled" (a write whose reply was lost),
the model keeps both possible states until a later read tells which one the store chose; after that read
the store must keep to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from statekeel.tasks import TRANSITIONS

# Which task transitions a caller may ask for: the documented table (docs/concepts.md).
TASK_TRANSITIONS: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in TRANSITIONS.items()}
MAX_RETRIES = 3
LEASE_SECONDS = 60  # what the model's worker claims and heartbeats for


@dataclass
class SessionModel:
    """One session: its live messages by position (a ``(session, seq)`` names one message forever: a
    message text never changes place), where compression stopped, and its tool calls."""

    messages: list[str] = field(default_factory=list)
    consolidated: int = 0
    # Another outcome the store may have chosen (a save whose reply was lost): messages after it.
    either: list[str] | None = None
    tool_calls_ran: dict[str, str] = field(default_factory=dict)  # call id -> the result it returned

    @property
    def head(self) -> int:
        return len(self.messages)

    def may_be(self) -> list[list[str]]:
        """What a load may return now: one history, or two until settled."""
        return [self.messages] if self.either is None else [self.messages, self.either]

    def settle(self, seen: list[str]) -> None:
        """A read showed which outcome the store chose: from now on only that one."""
        assert seen in self.may_be(), f"the store shows {seen}, the promises allow only {self.may_be()}"
        self.messages, self.either = list(seen), None


@dataclass
class TaskModel:
    status: str
    order: int  # creation order: claim takes the oldest queued task
    retries: int = 0
    epoch: int = 0
    steps: dict[str, int] = field(default_factory=dict)  # step -> the value its function returned
    # A transition whose reply was lost: the status it may have reached.
    either: str | None = None
    # The lease: who claimed the task and until when (the model clock's seconds); None without a lease
    # (not running, or running by a transition, which grants none).
    owner: str | None = None
    expires: float | None = None

    def leased_to(self, worker: str, epoch: int, now: float) -> bool:
        """Whether ``worker`` at ``epoch`` holds a live lease at ``now``: its fenced writes pass."""
        return (
            self.status == "running"
            and self.owner == worker
            and self.epoch == epoch
            and (self.expires is None or self.expires > now)
        )

    def claimed(self, worker: str, now: float) -> None:
        self.moved("running")
        self.owner, self.expires = worker, now + LEASE_SECONDS

    def may_move(self, to: str) -> bool:
        if to not in TASK_TRANSITIONS[self.status]:
            return False
        return not (self.status == "failed" and self.retries >= MAX_RETRIES)

    def moved(self, to: str) -> None:
        if self.status == "failed":
            self.retries += 1
        if to == "running":
            self.epoch += 1
            self.owner = None  # entering running without a claim fences out whoever held it
        self.status = to
        self.expires = None  # only a claim grants a lease; leaving running ends it

    def lease_expired(self) -> None:
        """``expire_leases`` found its lease over: interrupted, the owner kept (it no longer holds it)."""
        self.status, self.expires = "interrupted", None


@dataclass
class ApprovalModel:
    args: dict[str, str]
    order: int
    status: str = "pending"
    consumed: bool = False


@dataclass
class MemoryModel:
    content: str
    forgotten: bool = False
    events: list[str] = field(default_factory=list)  # what history() lists, oldest first


@dataclass
class StoreState:
    """Everything the promises say one store holds."""

    sessions: dict[str, SessionModel] = field(default_factory=dict)
    forks: dict[str, str] = field(default_factory=dict)  # fork key -> parent key
    tasks: dict[str, TaskModel] = field(default_factory=dict)
    approvals: dict[str, ApprovalModel] = field(default_factory=dict)
    memories: dict[str, MemoryModel] = field(default_factory=dict)
    made: int = 0  # a counter for names and texts that are never reused

    def fresh(self, prefix: str) -> str:
        self.made += 1
        return f"{prefix}{self.made}"

    def forget_everything(self) -> None:
        """A memory:// store does not outlive its process."""
        self.sessions.clear()
        self.forks.clear()
        self.tasks.clear()
        self.approvals.clear()
        self.memories.clear()

    # --- sessions -----------------------------------------------------------------------------------

    def fork(self, parent: str, at: int, child: str) -> None:
        """A fork's history is its parent's ``0..at-1`` then its own, whatever happens to the parent."""
        self.sessions[child] = SessionModel(messages=list(self.sessions[parent].messages[:at]))
        self.forks[child] = parent

    def rewind(self, key: str, to: int) -> None:
        """Messages ``to`` onwards leave the live history; forks below keep theirs."""
        self.sessions[key].messages = self.sessions[key].messages[:to]

    def may_rewind(self, key: str, to: int) -> bool:
        s = self.sessions[key]
        return s.either is None and s.consolidated <= to < s.head

    def may_compress(self, key: str, upto: int) -> bool:
        s = self.sessions[key]
        return s.either is None and s.consolidated < upto <= s.head

    def delete(self, key: str) -> None:
        del self.sessions[key]

    def has_forks(self, key: str) -> bool:
        return key in self.forks.values()

    # --- tasks ----------------------------------------------------------------------------------------

    def expired_leases(self, now: float) -> set[str]:
        """The running tasks whose lease is over at ``now`` (what ``expire_leases`` moves)."""
        return {
            tid
            for tid, t in self.tasks.items()
            if t.status == "running" and t.expires is not None and t.expires <= now
        }

    def oldest_queued(self) -> str | None:
        queued = [
            (t.order, tid) for tid, t in self.tasks.items() if t.status == "queued" and t.either is None
        ]
        return min(queued)[1] if queued else None

    # --- approvals ------------------------------------------------------------------------------------

    def usable_approval(self, args: dict[str, str]) -> str | None:
        usable = [
            (a.order, aid)
            for aid, a in self.approvals.items()
            if a.args == args and a.status == "granted" and not a.consumed
        ]
        return min(usable)[1] if usable else None
