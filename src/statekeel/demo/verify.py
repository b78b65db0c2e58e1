"""Checks a store against what the killed writer acknowledged.

Every acknowledged message must be there, in order, with dense sequence numbers and exactly the content
the demo agent writes at that position; messages committed but not yet acknowledged when the writer died
may be there too (and must be just as correct). The storage engine's integrity check must be clean.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..errors import StatekeelError, StorageCorrupt
from ..store import Store
from ..wording import counted
from .agent import expected_message


@dataclass(frozen=True, slots=True)
class SessionCheck:
    """What the verifier found for one session."""

    key: str
    acknowledged: int
    stored: int
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True, slots=True)
class Verification:
    """The verdict: ``ok`` only if every session checks out and the integrity check is clean."""

    sessions: tuple[SessionCheck, ...]
    integrity: tuple[str, ...] = ()
    problems: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.problems and not self.integrity and all(s.ok for s in self.sessions)

    @property
    def acknowledged(self) -> int:
        return sum(s.acknowledged for s in self.sessions)

    @property
    def stored(self) -> int:
        return sum(s.stored for s in self.sessions)

    def all_problems(self) -> list[str]:
        out = list(self.problems)
        out += [f"{s.key}: {p}" for s in self.sessions for p in s.problems]
        out += [f"integrity_check: {p}" for p in self.integrity]
        return out


async def check_session(store: Store, key: str, acked: Iterable[int]) -> SessionCheck:
    """Verify one session against its acknowledged sequence numbers."""
    acked_set = set(acked)
    problems: list[str] = []
    # The backend's row and messages on one snapshot: head_seq is what the store promised, not a count.
    found = await store.backend.load_session_with_messages(key)
    if found is None:
        # A session the writer was killed before saving promised nothing; one with acknowledged
        # messages must be there.
        return SessionCheck(key, len(acked_set), 0, ("session is missing",) if acked_set else ())
    record, rows = found
    seqs = [row.seq for row in rows]
    expected_seqs = list(range(record.last_consolidated, record.head_seq))
    if seqs != expected_seqs:
        problems.append(
            "sequence numbers are not dense and ordered: "
            f"expected {_span(expected_seqs)}, found {_span(seqs)}"
        )
    # What an agent would get back through the public API must be the same messages (a load that finds
    # a gap refuses with StorageCorrupt rather than return a history with a hole in it).
    try:
        session = await store.sessions.load(key)
    except StorageCorrupt as exc:
        problems.append(f"sessions.load() refuses the session: {exc}")
    else:
        if session is None or session.messages != [row.payload for row in rows]:
            problems.append("sessions.load() does not return the stored messages")
    present = set(seqs)
    missing = sorted(s for s in acked_set if s not in present)
    if missing:
        problems.append(f"{counted(len(missing), 'acknowledged message')} lost: seq {_span(missing)}")
    wrong = [row.seq for row in rows if row.payload != expected_message(key, row.seq)]
    if wrong:
        problems.append(
            f"{counted(len(wrong), 'message')} differ{'s' if len(wrong) == 1 else ''} from what was written: "
            f"seq {_span(wrong)}"
        )
    return SessionCheck(key, len(acked_set), len(rows), tuple(problems))


def _span(seqs: list[int]) -> str:
    if not seqs:
        return "none"
    if len(seqs) <= 6:
        return ", ".join(map(str, seqs))
    return f"{seqs[0]}, {seqs[1]}, …, {seqs[-1]} ({len(seqs)} in all)"


async def verify(
    store: Store, acked: Mapping[str, Iterable[int]], written: Iterable[str] = ()
) -> Verification:
    """Check the sessions the demo wrote — every key in ``acked`` and in ``written`` — and the storage's
    integrity. Other sessions of the store (a story demo's, an application's) are not the demo's and are
    left out: their messages are not the demo agent's.

    A read failure is reported as a problem, never as a missing session.
    """
    problems: list[str] = []
    checks: list[SessionCheck] = []
    try:
        keys = sorted(set(acked) | set(written))
        for key in keys:
            checks.append(await check_session(store, key, acked.get(key, ())))
        integrity = tuple(await store.backend.integrity_check())
    except StatekeelError as exc:
        problems.append(f"the store could not be read: {type(exc).__name__}: {exc}")
        integrity = ()
    return Verification(tuple(checks), integrity, tuple(problems))
