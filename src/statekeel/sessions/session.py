"""The in-memory session: its messages, and what the store holds of it.

A :class:`Session` owns its bookkeeping (the head the backend holds, the stored metadata and status, the
version its edits are based on, the fallback file whose content it holds …). Nothing outside this module
touches it: the rest of the package reads and changes it through :class:`SessionBook` (``book(session)``),
one named protocol — what a save would write (``changes``) and the transitions that follow each event of
the store (``saved``, ``fell_back``, ``refreshed``, ``compressed`` …), each saying which event it follows.
:mod:`statekeel.sessions.writes` applies the outcome of every write through it.

The rule for other writers' changes is the same for every part of a session: a save is conditional on
what it writes — new messages on the head they follow, metadata and status on the version the session
was loaded (or last brought up to date) at — and raises ``ConflictError`` when another writer changed it
first. Bringing a session up to date (``load()``, and the row every write returns) takes another writer's
metadata and status unless this session changed the same one; then the session keeps its base version,
so that its save conflicts instead of overwriting theirs.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..backends.base import SESSION_STATUSES, SessionRecord
from ..codec import Codec
from ..errors import InvalidArgument
from ..fallback import FallbackSnapshot
from ..transcripts import ToolCall, TranscriptIndex, normalize_item, safe_window
from ..usage import check_usage
from ..validation import check_bool, check_str
from .changes import Changes, message_batch
from .transcript import SessionTranscript


@dataclass(frozen=True, slots=True)
class Summary:
    """What one compression replaced: messages ``[first_seq, upto_seq)`` now in the archive."""

    compression_id: str
    first_seq: int
    upto_seq: int
    summary: str


@dataclass(frozen=True, slots=True)
class Rewind:
    """What ``sessions.rewind`` did: messages ``[to_seq, upto_seq)`` of session ``key`` left the live
    transcript for the archive under ``compression_id`` (read them with ``sessions.archived(key,
    compression_id)``), for ``reason``."""

    key: str
    compression_id: str
    to_seq: int
    upto_seq: int
    reason: str
    created_at: dt.datetime


# What a Session knows of the store (its bookkeeping), as opposed to what the caller changes.
_STORED: tuple[str, ...] = (
    "_head",
    "_rewinds",
    "_saved_last",
    "_in_backend",
    "_metadata_raw",
    "_saved_status",
    "_version",
)
_STORED += ("created_at", "updated_at", "_fallback_sig", "_fallback_head", "_unsure")
_stored_fields = operator.attrgetter(*_STORED)
# At most this many saves of one session whose outcome it never heard are remembered (the oldest is
# forgotten first): a bound on memory, far above what a caller's retries leave.
_MAX_UNSURE = 8


class Session:
    """A session in memory: its live messages plus what the store knows of it.

    ``messages`` holds the messages from ``last_consolidated`` on (or from seq 0 when loaded with
    ``include_archived=True``), in sequence order; ``summaries`` the compressions before them. Append with
    :meth:`add_message` or :meth:`add_item` and persist with ``SessionManager.save``; ``metadata`` and
    ``status`` may be changed in place and are saved when they differ from the stored ones.

    ``repaired`` lists the tool calls the load that returned this session answered with an interrupted
    result (calls a process that is gone left without one); see ``SessionManager.load``.
    """

    __slots__ = (
        "_codec",
        "_fallback_head",
        "_fallback_sig",
        "_first",
        "_full",
        "_head",
        "_in_backend",
        "_metadata_raw",
        "_owner",
        "_rewinds",
        "_saved_last",
        "_saved_status",
        "_saving",
        "_tools",
        "_unsure",
        "_usage",
        "_version",
        "created_at",
        "key",
        "last_consolidated",
        "messages",
        "metadata",
        "parent",
        "repaired",
        "status",
        "summaries",
        "updated_at",
    )

    def __init__(self, key: str, *, owner: object, codec: Codec, record: SessionRecord | None = None) -> None:
        self.key = key
        self._owner = owner
        self._codec = codec
        self.messages: list[dict[str, Any]] = []
        self.summaries: list[Summary] = []
        # The signature of the fallback file whose content this session holds (it wrote or merged it).
        self._fallback_sig: str | None = None
        self._fallback_head = 0  # the head sequence that file holds
        self._saving = asyncio.Lock()  # one save of this object at a time
        # The saves since the last one that was answered whose outcome this session never heard, by
        # write id: each may have landed (see _landed).
        self._unsure: dict[str, Changes] | None = None
        self._full = False
        # The last saved message object: if it is no longer at its place, the list was cut and regrown.
        self._saved_last: dict[str, Any] | None = None
        self._tools = SessionTranscript(record)
        self.repaired: tuple[ToolCall, ...] = ()
        # A fork's parent and the seq it forked at (its messages before that are the parent's).
        self.parent: tuple[str, int] | None = None
        if record is not None and record.parent_key is not None and record.parent_seq is not None:
            self.parent = (record.parent_key, record.parent_seq)
        self._rewinds = 0 if record is None else record.rewinds
        # The encoded usage of unsaved messages that recorded one, by seq (saved with them).
        self._usage: dict[int, bytes] | None = None
        if record is None:
            now = dt.datetime.now(dt.UTC)
            self.metadata: dict[str, Any] = {}
            self.status = "active"
            self.last_consolidated = 0
            self.created_at = self.updated_at = now
            self._first = 0
            self._head = 0
            self._version = 0
            self._in_backend = False
            self._metadata_raw: bytes | None = None
            self._saved_status = "active"
        else:
            self.metadata = record.metadata
            self.status = record.status
            self.last_consolidated = record.last_consolidated
            self.created_at = record.created_at
            self.updated_at = record.updated_at
            self._first = record.last_consolidated
            self._head = record.head_seq
            self._version = record.version
            self._in_backend = True
            self._metadata_raw = codec.encode(record.metadata, where="metadata")
            self._saved_status = record.status

    # --- public -----------------------------------------------------------------------------------------

    @property
    def head_seq(self) -> int:
        """The sequence number the next added message will get."""
        return self._first + len(self.messages)

    @property
    def fallback_file(self) -> str | None:
        """The path of the fallback file holding this session's last save (the backend could not take
        it; the file is replayed into the backend later), or None when that save reached the backend."""
        if self._fallback_sig is None:
            return None
        files = getattr(self._owner, "fallback", None)
        return None if files is None else str(files.file_for(self.key))

    @property
    def saved_head(self) -> int:
        """The head sequence the backend held when this session was last loaded or saved."""
        return self._head

    @property
    def rewinds(self) -> int:
        """How many rewinds the stored session had when this session was last loaded or saved. A seq is
        read together with it: ``(key, rewinds, seq)`` names one message forever (docs/branches.md), and
        every stored reference to a message carries it."""
        return self._rewinds

    @property
    def acknowledged_head(self) -> int:
        """The head sequence of what the store acknowledged: the messages before it are in the backend or,
        while it is unavailable, in this session's fallback file (a save that fell back returned, so they
        survive ``kill -9``); messages after it are being added and not written yet."""
        if self._fallback_sig is None:
            return self._head
        return max(self._head, min(self._fallback_head, self.head_seq))

    def add_message(
        self, role: str, content: Any, *, usage: Mapping[str, Any] | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Append a message in memory; raises a typed error (and adds nothing) if it cannot be stored.

        Pydantic models inside ``content`` or ``fields`` are stored as their JSON. A tool result must
        answer a call of this transcript that has no result yet, where its provider takes it
        (``UnknownToolCall``, ``ToolCallAlreadyAnswered``, ``TranscriptError`` otherwise).

        ``usage`` records what the turn cost with the message (``{"model": .., "input_tokens": ..,
        "output_tokens": .., "cost": ..}``, see :mod:`statekeel.usage`); checked first
        (``InvalidArgument``), and not part of the message itself.
        """
        check_str(role, "role")
        return self._append({"role": role, "content": content, **fields}, usage)

    def add_item(
        self, item: Any, *, strict: bool = True, usage: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Append any provider message or item as it is: a chat or Anthropic message, an OpenAI Responses
        item (which has a ``type`` and no ``role``), or a pydantic model of the OpenAI or Anthropic SDK
        (stored as its JSON, loaded back as an equal dict). Returns the dict stored; checked like
        :meth:`add_message`, nothing is added when it is refused.

            session.add_item(response.output[0])   # {"type": "function_call", "call_id": ..., ...}

        ``strict=False`` stores a tool result or call the transcript does not expect (a result answering
        no call of the session, or one already answered), as a framework's own store does: it is kept as
        it is, and counted among ``analyze()``'s orphans or malformed messages instead of refused. The
        item must still be a message that can be serialized. ``usage``: as in :meth:`add_message`.
        """
        check_bool(strict, "strict")
        return self._append(item, usage, strict=strict)

    def _append(
        self, item: Any, usage: Mapping[str, Any] | None = None, *, strict: bool = True
    ) -> dict[str, Any]:
        encoded_usage = None if usage is None else self._codec.encode(check_usage(usage), where="usage")
        message = normalize_item(item)
        index = self._tools.index(self.messages, self._first)
        self._codec.encode(message, where=f"messages[{self.head_seq}]")
        if strict:
            index.add(message)  # refuses (and changes nothing) before the message joins the list
        else:
            index.add_stored(message)
        if encoded_usage is not None:
            if self._usage is None:
                self._usage = {}
            self._usage[self.head_seq] = encoded_usage
        self.messages.append(message)
        return message

    def pending_calls(self) -> list[ToolCall]:
        """The tool calls still waiting for their result (those the model just asked for, or a killed run
        left), oldest first: answer each with ``sessions.run_tool`` (or ``add_item``).

            for call in session.pending_calls():
                await store.sessions.run_tool(session, call.call_id, tools[call.name])
        """
        return list(self._tools.index(self.messages, self._first).awaiting())

    def unsaved(self) -> list[dict[str, Any]]:
        """Messages the backend does not have yet (added since the last load or save)."""
        return self.messages[self._head - self._first :]

    def is_dirty(self) -> bool:
        """Whether saving would write anything (messages, metadata or status)."""
        if self.unsaved() or self.status != self._saved_status:
            return True
        if self._metadata_raw is None:
            return bool(self.metadata)
        return self._codec.encode(self.metadata, where="metadata") != self._metadata_raw

    def history(self, max_messages: int = 500) -> list[dict[str, Any]]:
        """The last messages (at most ``max_messages``, contiguous) made safe to send to an LLM, in any of
        the OpenAI chat, OpenAI Responses and Anthropic formats.

        Starts at the first user message in that range when there is one; never starts with a tool result
        whose call fell outside the range; never holds a tool call without its result (calls still
        waiting for theirs are left out until they have one). See :func:`statekeel.transcripts.safe_window`.
        """
        return safe_window(self.messages, max_messages)

    def __repr__(self) -> str:
        return (
            f"Session(key={self.key!r}, messages={len(self.messages)}, head_seq={self.head_seq}, "
            f"status={self.status!r})"
        )

    # --- what a save would write ------------------------------------------------------------------------

    def _check_append_only(self) -> None:
        """Refuse a message list whose saved part was removed or replaced: ``unsaved()`` would be wrong."""
        saved = self._head - self._first
        if saved <= 0:
            return
        last = self._saved_last
        if len(self.messages) < saved or (
            last is not None and self.messages[saved - 1] is not last and self.messages[saved - 1] != last
        ):
            raise InvalidArgument(
                f"session {self.key!r}: messages already saved (up to seq {self._head - 1}) were removed or "
                "replaced; history is append-only. Add messages with add_message() and use "
                "history(max_messages) for a shorter context",
                key=self.key,
            )

    def _changes(self) -> Changes:
        """What a save would write, checked and encoded; raises a typed error before anything is written."""
        self._check_append_only()
        if type(self.metadata) is not dict:
            raise InvalidArgument(
                f"session {self.key!r}: metadata must be a dict, got {type(self.metadata).__name__}",
                key=self.key,
            )
        base = self._head
        new = self.unsaved()
        batch = message_batch(self._codec, base, new)
        if self._usage is not None:
            usage = self._usage = {seq: u for seq, u in self._usage.items() if seq >= base} or None
            if usage is not None:
                batch = [
                    m if (u := usage.get(seq)) is None else replace(m, usage=u)
                    for seq, m in enumerate(batch, base)
                ]
        if self.status not in SESSION_STATUSES:
            raise InvalidArgument(
                f"session status must be one of {', '.join(SESSION_STATUSES)}, got {self.status!r}"
            )
        raw = self._codec.encode(self.metadata, where="metadata")
        metadata = raw if raw != self._metadata_raw else None
        status = self.status if self.status != self._saved_status else None
        return Changes(
            base=base,
            messages=new,
            batch=batch,
            metadata_raw=raw,
            metadata=metadata,
            status=status,
            create=not self._in_backend,
            expected_version=self._version
            if self._in_backend and (metadata is not None or status is not None)
            else None,
            expected_rewinds=self._rewinds if self._in_backend else None,
        )

    # --- helpers of the transitions (the store protocol is SessionBook) ------------------------------

    def _stored(self) -> tuple[Any, ...]:
        """What this session knows of the store, as one value (to undo a transition)."""
        stored: tuple[Any, ...] = _stored_fields(self)
        return stored

    def _restore(self, stored: tuple[Any, ...]) -> None:
        for name, value in zip(_STORED, stored, strict=True):
            setattr(self, name, value)

    def _mark_saved(self) -> None:
        saved = self._head - self._first
        self._saved_last = self.messages[saved - 1] if 0 < saved <= len(self.messages) else None

    def _metadata_edited(self) -> bool:
        if self._metadata_raw is None:
            return bool(self.metadata)
        return self._codec.encode(self.metadata, where="metadata") != self._metadata_raw

    def _take_theirs(self, record: SessionRecord) -> bool:
        """Another writer made ``record`` (this incarnation, at a newer version): take its metadata and
        status unless this session changed the same one too. Then False, and nothing is taken: the base
        version stays, so that this session's save conflicts rather than overwrite theirs."""
        stored = {} if self._metadata_raw is None else self._codec.decode(self._metadata_raw)
        theirs_metadata = record.metadata != stored
        theirs_status = record.status != self._saved_status
        if (theirs_metadata and self._metadata_edited()) or (
            theirs_status and self.status != self._saved_status
        ):
            return False
        if theirs_metadata:
            self.metadata = record.metadata
            self._metadata_raw = self._codec.encode(record.metadata, where="metadata")
        if theirs_status:
            self.status = self._saved_status = record.status
        self._version = record.version
        self.updated_at = record.updated_at
        return True


class SessionBook:
    """The store's protocol with one :class:`Session` (``book(session)``): what the session knows of the
    store, what a save would write, and the transitions that follow each event of the store — each named
    for that event. Public to the package, not to callers: the manager, :mod:`.writes`, :mod:`.fallback`
    and :mod:`.tools` read and change a session's bookkeeping only through it."""

    __slots__ = ("_s", "codec", "owner", "saving")

    def __init__(self, session: Session) -> None:
        self._s = session
        self.owner = session._owner  # the manager that made the session
        self.codec = session._codec
        self.saving = session._saving  # held while a write of this session object runs: one at a time

    # --- what the session knows of the store ------------------------------------------------------------

    @property
    def in_backend(self) -> bool:
        return self._s._in_backend

    @property
    def full(self) -> bool:
        """Loaded from seq 0 (``include_archived=True``)."""
        return self._s._full

    @property
    def unheard(self) -> bool:
        """Whether a save of the session may have landed without it hearing the answer."""
        return self._s._unsure is not None

    @property
    def fallback_signature(self) -> str | None:
        """The signature of the fallback file whose content the session holds."""
        return self._s._fallback_sig

    @property
    def transcript(self) -> SessionTranscript:
        """The tool calls of its transcript, and what the store said of its waiting ones."""
        return self._s._tools

    def index(self) -> TranscriptIndex:
        """The transcript index of its live messages, up to date with the list."""
        s = self._s
        return s._tools.index(s.messages, s._first)

    def append(self, item: Any, *, strict: bool = True) -> dict[str, Any]:
        """``add_item`` without its argument checks (the package's own messages)."""
        return self._s._append(item, strict=strict)

    def calls_stored(self, open_calls: int, calls_owner: str | None) -> None:
        """The store now counts ``open_calls`` waiting calls of ``calls_owner`` for the session."""
        tools = self._s._tools
        tools.stored_open, tools.calls_owner = open_calls, calls_owner

    # --- transitions: each follows one event of the store -----------------------------------------------

    def changes(self) -> Changes:
        """What a save would write, checked and encoded; a typed error before anything is written."""
        return self._s._changes()

    def expected_created_at(self) -> dt.datetime | None:
        """The incarnation a write must find (None for a session not in the backend yet)."""
        s = self._s
        return s.created_at if s._in_backend else None

    def loaded(self, messages: list[dict[str, Any]], summaries: list[Summary], *, full: bool) -> None:
        """The backend's messages of the record this session was made from (from seq 0 when ``full``)."""
        s = self._s
        s.messages = messages
        s.summaries = summaries
        if full:
            s._first = 0
            s._full = True
        s._mark_saved()

    def from_fallback(self, snap: FallbackSnapshot, signature: str) -> None:
        """A session the backend does not have, taken whole from its fallback file."""
        s = self._s
        s.metadata = snap.metadata
        s.status = snap.status
        s.created_at = snap.created_at
        s.updated_at = snap.updated_at
        s.messages = list(snap.messages)
        s._fallback_sig = signature
        s._fallback_head = s.head_seq

    def continued_by(self, snap: FallbackSnapshot, messages: list[dict[str, Any]], signature: str) -> None:
        """A fallback file continues what this session holds: ``messages`` (the file's messages this
        session lacks) become unsaved here, and so do the file's metadata and status changes."""
        s = self._s
        s.messages.extend(messages)
        if snap.metadata_changed:
            s.metadata = snap.metadata
        if snap.status_changed:
            s.status = snap.status
        s._fallback_sig = signature
        s._fallback_head = s.head_seq

    def fell_back(self, signature: str, head: int) -> None:
        """The unsaved part, up to ``head``, was written to the fallback file with ``signature``."""
        s = self._s
        s._fallback_sig = signature
        s._fallback_head = head

    def carried_from(self, old: Session) -> None:
        """``load()`` read this session fresh in place of the cached ``old``, which held unsaved changes
        but fell behind another writer's: ``old``'s metadata and status edits move here, so that the next
        save stores them or raises ``ConflictError``, never drops them. An edit of a field the other writer
        left alone becomes an edit of this session (saved on top of theirs); when they changed the same
        field, this session keeps ``old``'s base (version, stored metadata and status), so its save
        conflicts instead of overwriting theirs. Unsaved messages are not moved: they would follow
        another head (``old``'s save raises ``ConflictError``)."""
        s = self._s
        metadata_edited = old._metadata_edited()
        status_edited = old.status != old._saved_status
        if not (metadata_edited or status_edited):
            return
        if not (old._in_backend and s._in_backend and old.created_at == s.created_at):
            return  # deleted (and perhaps created again) meanwhile: nothing to edit on top of
        base = {} if old._metadata_raw is None else s._codec.decode(old._metadata_raw)
        collide = (metadata_edited and s._metadata_raw != old._metadata_raw and s.metadata != base) or (
            status_edited and s._saved_status != old._saved_status
        )
        if metadata_edited:
            s.metadata = s._codec.decode(s._codec.encode(old.metadata, where="metadata"))
        if status_edited:
            s.status = old.status
        if collide:
            s._version = old._version
            s._metadata_raw = old._metadata_raw
            s._saved_status = old._saved_status

    def in_step_with(self, record: SessionRecord) -> bool:
        """Whether ``record`` is the row this session was last loaded or saved at, but for its metadata
        and status (same incarnation, head and compression point)."""
        s = self._s
        return (
            s._in_backend
            and record.head_seq == s._head
            and record.last_consolidated == s.last_consolidated
            and record.created_at == s.created_at  # not deleted and created again
            and record.rewinds == s._rewinds
        )

    def refreshed(self, record: SessionRecord) -> bool:
        """``load()`` read ``record``, in step with this session: bring it up to date. False when another
        writer changed what this session changed too (the caller reloads it)."""
        s = self._s
        s._tools.stored(record)  # the waiting calls' count and owner change without a new version
        # A fork point moves without a new version of the fork (its parent rewound below it, deleted or
        # purged): the history is the same, only where it is read from changed.
        s.parent = (
            None
            if record.parent_key is None or record.parent_seq is None
            else (record.parent_key, record.parent_seq)
        )
        return record.version == s._version or s._take_theirs(record)

    def attempting(self, write_id: str, changes: Changes) -> None:
        """A save with ``write_id`` is about to write ``changes``. Until its answer arrives — it may never:
        the call can be cancelled after its COMMIT, or the COMMIT's answer be lost — it may have landed."""
        s = self._s
        unsure = s._unsure
        if unsure is None:
            s._unsure = {write_id: changes}
            return
        if len(unsure) >= _MAX_UNSURE:
            del unsure[next(iter(unsure))]
        unsure[write_id] = changes

    def attempt_failed(self, write_id: str) -> None:
        """The save with ``write_id`` was refused: it did not land."""
        s = self._s
        unsure = s._unsure
        if unsure is not None:
            unsure.pop(write_id, None)
            if not unsure:
                s._unsure = None

    def landed(self, record: SessionRecord) -> bool:
        """Whether ``record``'s last append is one of this session's saves whose answer it never heard;
        then that save is settled as done (the fallback file this session holds stays held until all of
        it is in the backend). False when another writer's append came last."""
        s = self._s
        unsure = s._unsure
        changes = None if unsure is None or record.write_id is None else unsure.get(record.write_id)
        if changes is None or record.head_seq != changes.base + len(changes.batch):
            return False
        held = s._fallback_sig
        self.saved(record, changes)
        s._fallback_sig = held
        return True

    def covered_fallback(self) -> str | None:
        """The signature of the fallback file this session holds when all it holds is in the backend now
        (nothing is unsaved): the session lets go of it, for the caller to delete."""
        s = self._s
        held = s._fallback_sig
        if held is None or s.is_dirty():
            return None
        s._fallback_sig = None
        return held

    def saved(self, record: SessionRecord, changes: Changes) -> None:
        """The backend took ``changes``; ``record`` is its row after them."""
        s = self._s
        # A write of metadata or status was conditional on the version: only an append of messages alone
        # can have passed another writer's change, which shows as a version jump.
        theirs = not changes.create and record.version != s._version + 1
        s._head = record.head_seq
        s._rewinds = record.rewinds
        s._mark_saved()
        s._in_backend = True
        s.created_at = record.created_at
        s._fallback_sig = None
        s._unsure = None
        s._tools.stored(record)
        if not (theirs and s._take_theirs(record)):
            if not theirs:
                s._metadata_raw = changes.metadata_raw
                s._saved_status = record.status
                s._version = record.version
            s.updated_at = record.updated_at

    def saved_undoably(self, record: SessionRecord, changes: Changes, write_id: str) -> Callable[[], None]:
        """:meth:`saved` inside an ``atomic()`` block: returns what undoes it if the block does not commit
        — it rolled back, or its COMMIT's answer was lost: then the save (``write_id``) may have landed."""
        s = self._s
        before = s._stored()
        calls_before = s._tools.stored_open, s._tools.calls_owner
        metadata, status = s.metadata, s.status
        self.saved(record, changes)
        taken_metadata, taken_status = s.metadata, s.status

        def undo() -> None:
            later = s._unsure  # what the undos of the block's later saves remembered (run first)
            s._restore(before)
            s._tools.stored_open, s._tools.calls_owner = calls_before
            if s.metadata is taken_metadata:
                s.metadata = metadata
            if s.status == taken_status:
                s.status = status
            for attempt in (later or {}).items():
                self.attempting(*attempt)
            self.attempting(write_id, changes)

        return undo

    def status_set(self, before: SessionRecord, record: SessionRecord) -> None:
        """The manager changed the stored status (expire, archive, reopen) of the row it read as
        ``before``; ``record`` is the row after."""
        s = self._s
        if not (self.in_step_with(before) and self.refreshed(before)):
            return  # behind, or changed here too: its next save conflicts, its next load reloads
        if s.status == s._saved_status:
            s.status = record.status
        s._saved_status = record.status
        s._version = record.version
        s.updated_at = record.updated_at

    def rewound(self, before: SessionRecord, record: SessionRecord) -> bool:
        """The manager rewound the stored session (``before`` → ``record``): drop the rewound tail from
        the messages. Only when in step with ``before`` and nothing is unsaved; False otherwise (the caller
        drops it from the cache: its next save conflicts)."""
        s = self._s
        if s.unsaved() or not (self.in_step_with(before) and self.refreshed(before)):
            return False
        to = record.head_seq
        if to < s._first:
            return False
        del s.messages[to - s._first :]
        s._usage = None  # nothing was unsaved
        s._head = to
        s._rewinds = record.rewinds
        s._version = record.version
        s.updated_at = record.updated_at
        if record.parent_key is not None and record.parent_seq is not None:
            s.parent = (record.parent_key, record.parent_seq)
        s._tools = SessionTranscript(record)
        s._mark_saved()
        return True

    def compressed(self, summary: Summary, before: SessionRecord, record: SessionRecord) -> None:
        """The manager compressed the stored session (``before`` → ``record``): drop what moved to the
        archive from the live messages. Only when this session is in step with ``before``: its saved
        messages then reach at least ``upto_seq``, so no unsaved message is ever dropped."""
        s = self._s
        if not (self.in_step_with(before) and self.refreshed(before)):
            return
        upto = summary.upto_seq
        if not s._full and s._first < upto:
            del s.messages[: upto - s._first]
            s._first = upto
        s.last_consolidated = upto
        s.summaries.append(summary)
        s._version = record.version
        s.updated_at = record.updated_at


def book(session: Session) -> SessionBook:
    """The store's protocol with ``session`` (see :class:`SessionBook`)."""
    return SessionBook(session)


__all__ = ["Rewind", "Session", "SessionBook", "Summary", "book"]
