"""Fallback files: where a session goes when the backend cannot take a write.

When a save fails with ``BackendUnavailable``, the session's unsaved part is written to
``<fallback_dir>/<file name of the key>.jsonl``: the first line is a header (key, the backend head the
messages follow, metadata, status …), then one codec-encoded message per line. The file is written to a
temporary file, flushed, fsynced, moved over the old one with ``os.replace`` and the directory fsynced, so a
crash leaves either the old file or the new one, never a torn one. Files are 0600 in a 0700 directory.

Each write puts a fresh random ``write_id`` in the header: a file's *signature*. Writers replace, delete
or quarantine a file only if it is still the one whose signature they hold (compare-and-swap), checked
and done under an exclusive ``flock`` of the directory, so that no process ever replaces or deletes a file
another process wrote in between without reading it. Readers take no lock: a read returns the snapshot
and the signature of the very file it read.

File names are an injective encoding of the key (``k-`` + lower-case letters, digits and ``-`` kept, every
other UTF-8 byte as ``_xx``), so ``a:b``, ``a_b`` and ``a/b`` get different files that never leave the
directory and do not collide on case-insensitive file systems either. A key whose encoding would be too
long for a file name gets ``h-`` + the SHA-256 of the key; its header holds the whole key and is checked
on every read.

Default directory: SQLite ``<database file>.fallback``; PostgreSQL
``$XDG_STATE_HOME/statekeel/fallback/<host>_<port>_<database>`` (``~/.local/state`` when unset); a plain
NATS store ``$XDG_STATE_HOME/statekeel/fallback/nats_<servers>_<prefix>`` (one paired with a SQL store:
the SQL store's); ``memory://`` has none (an in-memory store loses everything at exit, a file would
outlive the data it extends), so a failed save there raises.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import logging
import os
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from .backends.base import SESSION_STATUSES
from .codec import Codec
from .errors import ConflictError, SerializationError, StorageCorrupt
from .transcripts import role_of

log = logging.getLogger("statekeel.fallback")

FORMAT = 1
SUFFIX = ".jsonl"
_TMP_PREFIX = ".tmp-"
_QUARANTINE_MARK = ".corrupt-"
_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-")
# Linux and macOS allow 255 bytes per name; leave room for the temp and quarantine decorations.
_MAX_ENCODED = 180
_PATH_CACHE = 10_000
# A file re-sealed by key rotation is read again at most this many times when other writers replace it.
_RESEAL_TRIES = 5
# A temp file older than this was left by a crashed writer, not one writing now.
_STALE_TMP_SECONDS = 600


def file_stem(key: str) -> str:
    """The file name (without suffix) of a session key: injective, and always a plain name."""
    raw = key.encode("utf-8")
    out = "".join(chr(b) if b in _SAFE else f"_{b:02x}" for b in raw)
    if len(out) + 2 <= _MAX_ENCODED:
        return "k-" + out
    return "h-" + hashlib.sha256(raw).hexdigest()


def default_dir(url: str) -> str | None:
    """The default fallback directory of a store URL (see the module docstring)."""
    parts = urlsplit(url)
    if parts.scheme == "memory":
        return None
    if parts.scheme == "nats":
        from .backends.nats.url import paired_url, parse_nats_url

        rest = paired_url(url)  # a paired store keeps its fallback files beside its SQL store
        if rest is not None:
            return default_dir(rest)
        parsed = parse_nats_url(url)
        servers = ",".join(sorted(s.partition("://")[2].rpartition("@")[2] for s in parsed.servers))
        return _state_dir(file_stem(f"nats_{servers}_{parsed.prefix}"))
    if parts.scheme == "sqlite":
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        return path + ".fallback"
    try:
        server = f"{parts.hostname or 'localhost'}_{parts.port or 5432}"
    except ValueError:  # several hosts (h1:5432,h2:5433), tried in turn: the whole list names the server
        server = parts.netloc.rpartition("@")[2]
    target = f"{server}_{parts.path.lstrip('/') or 'postgres'}"
    return _state_dir(file_stem(target))


def _state_dir(name: str) -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "statekeel", "fallback", name)


class FallbackCorrupt(StorageCorrupt):
    """A fallback file cannot be read back (a torn or edited line); it gets quarantined."""


class FallbackChanged(ConflictError):
    """The key's fallback file is no longer the one the caller read or wrote: another writer changed it.

    ``current`` is the signature of the file there now (None: there is none)."""


# ``FallbackDir.write(snap, replacing=ANY)``: replace whatever file is there (tools and tests only).
ANY: Any = object()


@dataclass(frozen=True, slots=True)
class FallbackSnapshot:
    """What a fallback file holds: messages ``[base_head, head)`` and the session's fields."""

    key: str
    base_head: int
    in_backend: bool  # whether the session existed in the backend when the file was written
    status: str
    metadata: dict[str, Any]
    status_changed: bool  # whether status / metadata differ from what the backend held at base_head
    metadata_changed: bool
    last_consolidated: int
    created_at: dt.datetime
    updated_at: dt.datetime
    messages: list[dict[str, Any]]
    # The session's rewind count the file was taken under: its seqs name messages of that count's live
    # transcript only (docs/branches.md). None: a file written before files carried it (taken as 0).
    rewinds: int | None = None

    @property
    def head(self) -> int:
        return self.base_head + len(self.messages)


@dataclass(slots=True)
class ReplayReport:
    """What ``SessionManager.replay_fallback()`` did, per session key."""

    replayed: dict[str, int] = field(default_factory=dict)  # key -> messages written to the backend
    stale: list[str] = field(default_factory=list)  # already in the backend (a crash before the delete)
    skipped: list[str] = field(default_factory=list)  # held in this process: its holder's save writes it
    failed: dict[str, str] = field(default_factory=dict)  # key -> why it stays on disk for the next try
    quarantined: dict[str, str] = field(default_factory=dict)  # quarantined path -> reason

    @property
    def ok(self) -> bool:
        """True when no fallback content is left unreplayed."""
        return not self.failed and not self.quarantined and not self.skipped


class FallbackDir:
    """The fallback files of one store. Blocking I/O: call it from a worker thread."""

    def __init__(self, path: str | os.PathLike[str], codec: Codec) -> None:
        self.path = os.fspath(path)
        self.codec = codec
        # Every load and save checks for its key's file: the path is computed once per key.
        self._paths: dict[str, str] = {}

    def file_for(self, key: str) -> str:
        path = self._paths.get(key)
        if path is None:
            if len(self._paths) >= _PATH_CACHE:
                self._paths.clear()
            path = self._paths[key] = os.path.join(self.path, file_stem(key) + SUFFIX)
        return path

    def exists(self, key: str) -> bool:
        # Asked by every save and load, and there is no file nearly always: access() answers without the
        # FileNotFoundError that os.path.exists raises, formats and catches for a missing file.
        return os.access(self.file_for(key), os.F_OK)

    def _ensure_dir(self) -> None:
        os.makedirs(self.path, mode=0o700, exist_ok=True)
        st = os.stat(self.path)
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(self.path, 0o700)

    def encode(self, snap: FallbackSnapshot, write_id: str | None = None) -> bytes:
        header = {
            "statekeel_fallback": FORMAT,
            "write_id": write_id or secrets.token_hex(16),
            "key": snap.key,
            "base_head": snap.base_head,
            "count": len(snap.messages),
            "in_backend": snap.in_backend,
            "status": snap.status,
            "metadata": snap.metadata,
            "status_changed": snap.status_changed,
            "metadata_changed": snap.metadata_changed,
            "last_consolidated": snap.last_consolidated,
            "created_at": snap.created_at,
            "updated_at": snap.updated_at,
            "rewinds": snap.rewinds,
        }
        # Messages were validated by add_message/save; encoding here keeps their exact tagged values.
        lines = [self.codec.encode(header, where="fallback header")]
        cipher = self.codec.cipher
        for seq, m in enumerate(snap.messages, snap.base_head):
            line = self.codec.encode(m, where=f"messages[{seq}]")
            # Sealed as the backend seals them: the file is data at rest too.
            lines.append(line if cipher is None else cipher.seal(line, "message", (snap.key, seq)))
        return b"\n".join(lines) + b"\n"

    def write(self, snap: FallbackSnapshot, *, replacing: str | None = ANY) -> str:
        """Atomically replace the key's file with ``snap``; the old file survives any failure. Returns the
        path. With ``replacing`` (a signature, or None for "no file"), only if the file there is that one:
        ``FallbackChanged`` otherwise."""
        return self.write_signed(snap, replacing=replacing)[0]

    def write_signed(self, snap: FallbackSnapshot, *, replacing: str | None = ANY) -> tuple[str, str]:
        """:meth:`write`, returning the path and the new file's signature."""
        write_id = secrets.token_hex(16)
        data = self.encode(snap, write_id)
        self._ensure_dir()
        target = self.file_for(snap.key)
        with self._locked():
            if replacing is not ANY:
                current = self._signature_at(target)
                if current != replacing:
                    raise FallbackChanged(
                        f"the fallback file of session {snap.key!r} was changed by another writer",
                        key=snap.key,
                        current=current,
                    )
            self._replace(target, data)
        return target, write_id

    def _replace(self, target: str, data: bytes) -> None:
        tmp = os.path.join(self.path, f"{_TMP_PREFIX}{secrets.token_hex(6)}-{os.path.basename(target)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        self._fsync_dir()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the directory's exclusive lock: one compare-and-swap at a time, across processes."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _fsync_dir(self) -> None:
        dfd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def read(self, key: str) -> FallbackSnapshot | None:
        """The key's snapshot, or None if it has no file. ``FallbackCorrupt`` if it cannot be read back."""
        found = self.read_signed(key)
        return None if found is None else found[0]

    def read_signed(self, key: str) -> tuple[FallbackSnapshot, str] | None:
        """The key's snapshot and the signature of the file it was read from, or None if it has none."""
        path = self.file_for(key)
        try:
            snap, signature = self.read_path_signed(path)
        except FileNotFoundError:
            return None
        if snap.key != key:
            raise FallbackCorrupt(f"fallback file {path} holds session {snap.key!r}, not {key!r}", path=path)
        return snap, signature

    def read_path(self, path: str) -> FallbackSnapshot:
        return self.read_path_signed(path)[0]

    def read_path_signed(self, path: str) -> tuple[FallbackSnapshot, str]:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            data = fh.read()
        return self.parse(path, data), _signature(data.split(b"\n", 1)[0], st)

    def _messages(self, header: dict[str, Any], lines: list[bytes]) -> list[Any]:
        cipher = self.codec.cipher
        if cipher is None:
            return [self.codec.decode(line) for line in lines]
        key, base = header.get("key"), header.get("base_head")
        if type(key) is not str or type(base) is not int:
            raise SerializationError("the header names no session key and base head")
        return [
            cipher.decode(self.codec, orjson.loads(line), "message", (key, seq))
            for seq, line in enumerate(lines, base)
        ]

    def parse(self, path: str, data: bytes) -> FallbackSnapshot:
        lines = data.split(b"\n")
        if not lines or lines[-1] != b"":
            raise FallbackCorrupt(f"fallback file {path} does not end with a newline (torn write)", path=path)
        lines.pop()
        try:
            header = self.codec.decode(lines[0]) if lines else None
            if not isinstance(header, dict) or header.get("statekeel_fallback") != FORMAT:
                raise FallbackCorrupt(f"fallback file {path} has no statekeel header", path=path)
            messages = self._messages(header, lines[1:])
        except (SerializationError, orjson.JSONDecodeError) as exc:
            raise FallbackCorrupt(f"fallback file {path} has an unreadable line: {exc}", path=path) from None
        try:
            snap = FallbackSnapshot(
                key=header["key"],
                base_head=header["base_head"],
                in_backend=header["in_backend"],
                status=header["status"],
                metadata=header["metadata"],
                status_changed=header["status_changed"],
                metadata_changed=header["metadata_changed"],
                last_consolidated=header["last_consolidated"],
                created_at=header["created_at"],
                updated_at=header["updated_at"],
                messages=messages,
                rewinds=header.get("rewinds"),
            )
        except KeyError as exc:
            raise FallbackCorrupt(f"fallback file {path} header lacks {exc}", path=path) from None
        ok = (
            type(snap.key) is str
            and type(snap.base_head) is int
            and snap.base_head >= 0
            and header.get("count") == len(messages)
            and isinstance(snap.metadata, dict)
            # What a load or replay would write as is: must pass what save() checks.
            and snap.status in SESSION_STATUSES
            and type(snap.in_backend) is bool
            and type(snap.status_changed) is bool
            and type(snap.metadata_changed) is bool
            and type(snap.last_consolidated) is int
            and isinstance(snap.created_at, dt.datetime)
            and isinstance(snap.updated_at, dt.datetime)
            and (snap.rewinds is None or (type(snap.rewinds) is int and snap.rewinds >= 0))
            and all(role_of(m) is not None for m in messages)
        )
        if not ok:
            raise FallbackCorrupt(f"fallback file {path} has an inconsistent header or messages", path=path)
        if os.path.basename(path) != file_stem(snap.key) + SUFFIX:
            raise FallbackCorrupt(
                f"fallback file {path} holds session {snap.key!r} of another name", path=path
            )
        return snap

    def reseal(self, path: str) -> bool:
        """Seal the messages of the file at ``path`` under the codec's current key (key rotation): the
        file is written again whole, atomically, as :meth:`write` does, with the same signature (the
        sessions holding it keep holding it), and only if it is still the file that was read
        (compare-and-swap; one rewritten meanwhile is read again). True when it was rewritten; False when
        every message was under the current key already, or the file is gone. Raises what reading it
        raises (``FallbackCorrupt``, ``DecryptionError``, ``PlaintextRefused``): nothing is written then."""
        cipher = self.codec.cipher
        if cipher is None:
            return False
        for _ in range(_RESEAL_TRIES):
            try:
                with open(path, "rb") as fh:
                    st = os.fstat(fh.fileno())
                    data = fh.read()
            except FileNotFoundError:
                return False
            snap = self.parse(path, data)
            lines = data.split(b"\n")
            signature = _signature(lines[0], st)
            if all(
                cipher.settled(
                    cipher.stored_key_id(orjson.loads(line), "message", (snap.key, seq)),
                    "message",
                    (snap.key, seq),
                )
                for seq, line in enumerate(lines[1:-1], snap.base_head)
            ):
                return False
            fresh = self.encode(snap, None if signature.startswith("stat:") else signature)
            with self._locked():
                if self._signature_at(path) != signature:
                    continue  # another writer replaced it since it was read: read it again
                self._replace(path, fresh)
            return True
        raise FallbackChanged(
            f"the fallback file {path} was replaced {_RESEAL_TRIES} times while it was being re-sealed",
            path=path,
        )

    def signature(self, key: str) -> str | None:
        """The signature of the key's current file (None when it has none)."""
        return self._signature_at(self.file_for(key))

    @staticmethod
    def _signature_at(path: str) -> str | None:
        try:
            with open(path, "rb") as fh:
                st = os.fstat(fh.fileno())
                header = fh.readline()
        except FileNotFoundError:
            return None
        return _signature(header, st)

    def delete(self, key: str, signature: str | None = None) -> bool:
        """Remove the key's file — only if it is still the one with ``signature``, when given."""
        path = self.file_for(key)
        try:
            with self._locked():
                if signature is not None and self._signature_at(path) != signature:
                    return False
                os.unlink(path)
        except FileNotFoundError:  # no file, or not even the directory
            return False
        self._fsync_dir()
        return True

    def quarantine(self, path: str, reason: str, signature: str | None = None) -> str | None:
        """Rename a bad file aside (kept for a human, never read again) and log why; with ``signature``,
        only if it is still that file. The new path, or None when it was not renamed."""
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%f")
        target = f"{path}{_QUARANTINE_MARK}{stamp}"
        with self._locked():
            if signature is not None and self._signature_at(path) != signature:
                return None
            os.replace(path, target)
        self._fsync_dir()
        log.warning("fallback file %s quarantined as %s: %s", path, target, reason)
        return target

    def files(self) -> Iterator[str]:
        """Paths of the live fallback files; removes temp files crashed writers left behind."""
        try:
            entries = list(os.scandir(self.path))
        except FileNotFoundError:
            return
        now = time.time()
        for entry in entries:
            name = entry.name
            if name.startswith(_TMP_PREFIX):
                try:
                    if now - entry.stat().st_mtime > _STALE_TMP_SECONDS:
                        os.unlink(entry.path)
                except FileNotFoundError:
                    pass
                continue
            if name.endswith(SUFFIX) and (name.startswith("k-") or name.startswith("h-")):
                yield entry.path


def _signature(header: bytes, st: os.stat_result) -> str:
    """A file's signature: the ``write_id`` of its header; for a file without one (written by an older
    statekeel, or unreadable) its inode, size and modification time."""
    try:
        fields = orjson.loads(header)
    except orjson.JSONDecodeError:
        fields = None
    write_id = fields.get("write_id") if isinstance(fields, dict) else None
    if isinstance(write_id, str) and write_id:
        return write_id
    return f"stat:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


__all__ = [
    "ANY",
    "FallbackChanged",
    "FallbackCorrupt",
    "FallbackDir",
    "FallbackSnapshot",
    "ReplayReport",
    "default_dir",
    "file_stem",
]
