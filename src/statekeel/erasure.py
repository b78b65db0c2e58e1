"""Erasure: ``await store.erase(subject, actor=..., reason=...)`` deletes everything about one subject.

    report = await store.erase("user:alice", actor="dpo@example.com", reason="GDPR art. 17 request 2026-113")
    print(report.counts)                         # rows per kind
    report = await store.erase("user:alice", dry_run=True, actor="dpo", reason="preview")

What is the subject's:

- sessions whose key is the subject, or whose ``metadata["subject"]`` is (a string), with their
  messages, summaries, message archive, the messages its rewinds took out of the live transcript
  (``rewound_messages``) and tool-call journal; their fallback files (also a session that only a
  fallback file holds, and quarantined copies of those files); the episodes recorded for them (and their
  vectors); their file ledger records; the spans of the trace named after them, and spans whose
  attributes' ``session_key`` (or ``session.id``) is one of them; the LangGraph checkpoints of the thread
  named after them; the vectors of a source named after them; their lease rows, unless a live process
  holds one (counted as ``leases_held``: run the erasure again once it is gone); and the forks of those
  sessions, and forks of forks, whatever their key or metadata (a fork's history is its parent's
  prefix), each erased in its parent's batch before it;
- what is named after the subject itself even without a session of that key: the spans of the trace,
  the LangGraph checkpoints of the thread, the episodes and file ledger records of that key;
- spans whose attributes' ``subject`` is the subject;
- memories of scope ``subject``, with their history, access log, contradictions (an open one is resolved
  as ``"erased"`` first), the graph relations they produced and their vectors;
- graph relations whose subject or object entity is the subject, and episodes that name it among their
  entities (with their vectors).

What stays: audit entries and approvals (append-only; they hold ids and hashes, never payloads — name
sessions by an id, not by a person's name, if the name must go too), tasks and workflows (nothing ties
them to a subject). One ``erasure`` audit entry records who (``actor``), why (``reason``) and the counts;
it names the subject by its SHA-256 only, so that the erasure does not write the subject back.

Batches: the subject's sessions are found on a snapshot without holding the write lock, then deleted
``batch_size`` at a time, one short transaction each, every delete re-checking in its statement that the
row is still the subject's. A process killed midway leaves whole batches done; run the erasure again and
it finishes (the audit entry is written by the run that finishes). On SQLite deleted rows are overwritten
(``secure_delete``) and the WAL is checkpointed and truncated at the end, so the subject's text is gone
from the database file and its WAL; another connection holding a read snapshot keeps the checkpoint from
finishing, so it is tried again for up to ``log_wait`` seconds, and if it still cannot finish the report
says so (``complete`` False, with ``left`` and ``advice``) and the audit entry records
``"complete": false``: run the erasure again once the reader is gone. On PostgreSQL see
``docs/retention.md`` (VACUUM).

With a key ring (``open_store(keyring=...)``, see :mod:`statekeel.codec.keyring`) the erasure also destroys
the data keys of the subject and of each session it erases, after their rows are gone, so the copies of
those rows in backups taken before can no longer be read (:class:`~statekeel.errors.SubjectErased`). The
keys to destroy are recorded in the ring before the first row goes, so a run killed between the rows and
the keys is finished by the next. Without a ring, erasure deletes rows only: a backup keeps what it held.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import os
import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Protocol

from .backends.base import ErasureBatch, StorageBackend
from .errors import InvalidArgument, StatekeelError
from .fallback import SUFFIX, FallbackDir, file_stem
from .validation import check_bool, check_int, check_key, check_text

if TYPE_CHECKING:
    from .audit import AuditLog
    from .codec import Codec
    from .memory import MemoryStore
    from .sessions import SessionManager
    from .traces import TraceLog

_QUARANTINED = SUFFIX + ".corrupt-"
LOG_WAIT = 5.0  # seconds an erasure retries the SQLite log's checkpoint while a reader holds it up


class Erasable(Protocol):
    """What an erasure needs of a store (a :class:`statekeel.Store` has it): its backend, the buffered
    tiers to flush, the sessions' cache and fallback files, the audit log its entry goes to, and its
    codec (whose key ring holds the subject's data keys)."""

    @property
    def backend(self) -> StorageBackend: ...
    @property
    def traces(self) -> TraceLog: ...
    @property
    def memory(self) -> MemoryStore: ...
    @property
    def sessions(self) -> SessionManager: ...
    @property
    def audit(self) -> AuditLog: ...
    @property
    def codec(self) -> Codec: ...

    def holds(self, kind: str) -> bool:
        """Whether the store's backend holds ``kind`` (a manager's name or a state kind)."""
        ...


@dataclass(frozen=True, slots=True)
class ErasureReport:
    """What ``store.erase`` deleted — or, with ``dry_run``, would delete — per kind.

    ``subject_sha256`` names the subject as the audit entry does; ``audit_seq`` is that entry's sequence
    number (None in a dry run). ``leases_held`` counts sessions whose lease row was kept because a live
    process holds it. ``data_keys`` counts the data keys destroyed in the key ring (would be, in a dry
    run; always 0 for a store without one). ``batches`` counts the transactions,
    ``longest_batch_seconds`` the longest one (on SQLite: how long it held the write lock).
    ``session_keys`` lists the keys erased as the subject's (its sessions', and the subject itself).
    ``complete`` is False when the erasure is not finished on disk although the rows are deleted: on
    SQLite, a reader's snapshot kept the write-ahead log from being checkpointed within ``log_wait``, so
    the erased rows' old pages are still in the database file and its log; ``left`` says what is left
    and ``advice`` what finishes it (run the erasure again once the reader is gone). Both are empty when
    ``complete``.
    """

    subject_sha256: str
    dry_run: bool
    sessions: int = 0
    messages: int = 0
    archived_messages: int = 0
    rewound_messages: int = 0
    compressions: int = 0
    tool_calls: int = 0
    fallback_files: int = 0
    episodes: int = 0
    memories: int = 0
    memory_events: int = 0
    memory_accesses: int = 0
    contradictions: int = 0
    relations: int = 0
    vectors: int = 0
    traces: int = 0
    checkpoints: int = 0
    file_changes: int = 0
    leases_held: int = 0
    data_keys: int = 0
    batches: int = 0
    seconds: float = 0.0
    longest_batch_seconds: float = 0.0
    audit_seq: int | None = None
    session_keys: tuple[str, ...] = field(default=(), repr=False)
    complete: bool = True
    left: str = ""
    advice: str = ""

    @property
    def counts(self) -> dict[str, int]:
        """Rows (and files) per kind, the kinds with nothing included."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in KINDS}

    @property
    def total(self) -> int:
        return sum(self.counts.values())


KINDS = (
    "sessions", "messages", "archived_messages", "rewound_messages", "compressions", "tool_calls",
    "fallback_files", "episodes", "memories", "memory_events", "memory_accesses", "contradictions",
    "relations", "vectors", "traces", "checkpoints", "file_changes",
)  # fmt: skip


def subject_digest(subject: str) -> str:
    """The SHA-256 (hex) of a subject's UTF-8 text: how the audit log names an erased subject."""
    return hashlib.sha256(subject.encode("utf-8")).hexdigest()


@dataclass(slots=True)
class _Tally:
    backend: StorageBackend
    dry_run: bool
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys((*KINDS, "leases_held"), 0))
    batches: int = 0
    longest: float = 0.0

    async def add(self, batch: ErasureBatch) -> None:
        for kind, n in batch.counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + n
        self.batches += 1
        self.longest = max(self.longest, batch.seconds)
        if not self.dry_run and (pause := self.backend.batch_pause(batch.seconds)) > 0:
            await asyncio.sleep(pause)  # other processes' writers take the lock in between


def _fallback_matches(files: FallbackDir, subject: str, keys: set[str]) -> list[tuple[str, str | None]]:
    """(path, key) of the fallback files of the subject's sessions — those of ``keys``, and those whose
    own header names the subject (a session only a fallback file holds) — and of their quarantined
    copies (key None). Blocking: run in a thread."""
    found: list[tuple[str, str | None]] = []
    named = {file_stem(key) + SUFFIX: key for key in keys}
    for path in files.files():
        try:
            snap = files.read_path(path)
        except (StatekeelError, OSError):
            # Unreadable here (damaged, or sealed under a key this store was not opened with): the file
            # of one of the sessions by its name, else left for the load or replay that quarantines it.
            key = named.get(os.path.basename(path))
            if key is not None:
                found.append((path, key))
            continue
        if snap.key in keys or snap.key == subject or snap.metadata.get("subject") == subject:
            keys.add(snap.key)
            found.append((path, snap.key))
    stems = {file_stem(key) + _QUARANTINED for key in keys}
    try:
        entries = list(os.scandir(files.path))
    except FileNotFoundError:
        return found
    for entry in entries:
        if any(entry.name.startswith(stem) for stem in stems):
            found.append((entry.path, None))
    return found


def _remove_files(files: FallbackDir, found: list[tuple[str, str | None]]) -> int:
    removed = 0
    for path, key in found:
        if key is not None:
            removed += files.delete(key)
            continue
        try:
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            pass
    return removed


async def erase(
    store: Erasable,
    subject: str,
    *,
    dry_run: bool,
    actor: str,
    reason: str,
    batch_size: int = 100,
    log_wait: float = LOG_WAIT,
) -> ErasureReport:
    """See the module documentation; ``Store.erase`` is the public entry."""
    check_key(subject, "subject")
    check_bool(dry_run, "dry_run")
    check_key(actor, "actor")
    check_text(reason, "reason")
    check_int(batch_size, "batch_size", minimum=1)
    if type(log_wait) not in (int, float) or not 0 <= log_wait <= 3600:
        raise InvalidArgument(f"log_wait must be a number of seconds from 0 to 3600, got {log_wait!r}")
    began = time.perf_counter()
    now = dt.datetime.now(dt.UTC)
    data_keys = 0
    backend = store.backend
    tally = _Tally(backend, dry_run)
    # Buffered tiers first: spans and accesses the process still holds are erased with the rest.
    await store.traces.flush()
    if store.holds("memory"):  # a plain NATS store holds none
        await store.memory.flush()

    # The subject itself is one of the keys even without a session of that key: the trace, LangGraph
    # thread, episodes and file records named after it are the subject's too.
    keys: set[str] = {subject}
    after: str | None = None
    while True:
        page = await backend.erasure_sessions(subject, after=after, limit=1000)
        keys.update(page)
        if len(page) < 1000:
            break
        after = page[-1]
    files = store.sessions.fallback
    found = [] if files is None else await asyncio.to_thread(_fallback_matches, files, subject, keys)
    ordered = sorted(keys)
    digest = subject_digest(subject)
    ring = None if store.codec.cipher is None else store.codec.cipher.ring
    if ring is not None:
        if dry_run:
            data_keys = await asyncio.to_thread(ring.count, ordered)
        else:
            # Before any row goes: a run killed once the rows (which name the sessions) are gone still
            # knows, in the next run, whose data keys to destroy.
            await asyncio.to_thread(ring.mark, digest, ordered)
    if files is not None:
        # Files before rows: a crash in between leaves the rows, which the next run finds again.
        removed = len(found) if dry_run else await asyncio.to_thread(_remove_files, files, found)
        tally.counts["fallback_files"] += removed

    span_after: tuple[str, str] | None = None
    while True:
        spans = await backend.erasure_spans(subject, ordered, after=span_after, limit=batch_size * 10)
        if spans:
            await tally.add(await backend.erase_spans(subject, ordered, spans, dry_run=dry_run))
        if len(spans) < batch_size * 10:
            break
        span_after = spans[-1]

    late: list[str] = []
    for i in range(0, len(ordered), batch_size):
        chunk = ordered[i : i + batch_size]
        batch = await backend.erase_sessions(subject, chunk, now=now, dry_run=dry_run)
        await tally.add(batch)
        if dry_run:
            continue
        # A fork made since the sessions were listed went with its parent's batch: its data key goes
        # too (marked now, so that a run killed before the keys still destroys it).
        found_late = [k for k in batch.keys if k not in keys]
        if found_late and ring is not None:
            await asyncio.to_thread(ring.mark, digest, found_late)
        keys.update(found_late)
        late.extend(found_late)
        for key in (*chunk, *found_late):
            store.sessions.evict(key)
    ordered = sorted(keys) if late else ordered

    cursor: str | None = None
    while True:
        batch = await backend.erase_memories(
            subject, after=cursor, limit=batch_size, now=now, dry_run=dry_run
        )
        await tally.add(batch)
        if (cursor := batch.after) is None:
            break
    while True:
        batch = await backend.erase_relations(subject, after=cursor, limit=batch_size, dry_run=dry_run)
        await tally.add(batch)
        if (cursor := batch.after) is None:
            break
    while True:
        batch = await backend.erase_episodes(
            subject, ordered, after=cursor, limit=batch_size, dry_run=dry_run
        )
        await tally.add(batch)
        if (cursor := batch.after) is None:
            break

    if ring is not None and not dry_run:
        # After the rows: the data keys (marked above, by this run or a killed one) go, synced — but not
        # the key of a session that stayed because it no longer names the subject.
        marked = await asyncio.to_thread(ring.pending, digest)
        stayed = [k for k in marked if k != subject and await backend.load_session(k) is not None]
        data_keys = await asyncio.to_thread(ring.destroy, digest, stayed)
    counts = {kind: tally.counts[kind] for kind in KINDS}
    audit_seq = None
    complete, left, advice = True, "", ""
    if not dry_run:
        # Before the audit entry, which says whether it finished: the log held the erased rows' old
        # pages, and a reader's snapshot can keep it from being copied and truncated for a while.
        complete = await backend.shrink_log(wait=log_wait)
        if not complete:
            left = (
                "the erased rows are deleted, but their old pages are still in the database file and its "
                f"write-ahead log: a reader kept its snapshot for more than {log_wait:g} s, so the log "
                "could not be checkpointed"
            )
            advice = (
                "end the long read (a process holding a transaction open on the database), then run the "
                "erasure again (statekeel erase SUBJECT, or store.erase): it deletes nothing more and "
                "checkpoints the log"
            )
        entry = await store.audit.append(
            "erasure",
            actor,
            f"sha256:{digest}",
            {
                "subject_sha256": digest,
                "reason": reason,
                "counts": counts,
                "leases_held": tally.counts["leases_held"],
                "data_keys": data_keys,
                "complete": complete,
            },
        )
        audit_seq = entry.seq
    return ErasureReport(
        subject_sha256=digest,
        dry_run=dry_run,
        leases_held=tally.counts["leases_held"],
        data_keys=data_keys,
        batches=tally.batches,
        seconds=time.perf_counter() - began,
        longest_batch_seconds=tally.longest,
        audit_seq=audit_seq,
        session_keys=tuple(ordered),
        complete=complete,
        left=left,
        advice=advice,
        **counts,
    )


__all__ = ["Erasable", "ErasureReport", "erase", "subject_digest"]
