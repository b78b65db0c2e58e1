"""The key ring: per-subject data keys, kept outside the database so that erasure reaches old backups.

    await statekeel.create_keyring("/var/lib/agent/keys/ring.db", key)          # once, next to no backup
    store = await statekeel.open_store(url, encryption_key=key, keyring="/var/lib/agent/keys/ring.db")

With a ring, a session's messages (live, archived, rewound, and its fallback files) are sealed under a
data key of their own session, and a memory's content and data under a data key of its scope; step
results and approval arguments, which belong to no subject, stay under the store key. Each data key is a
random AES-256 key, kept in the ring wrapped (AES-256-GCM) by the store key, with the SHA-256 of its
owner (the session key or scope) and its own key id as associated data; the envelope of every value
sealed under it names that key id, so a read finds the key without knowing the subject.

``store.erase(subject)`` destroys the data keys of the subject and of every session it erases, once their
rows are gone: a copy of the database taken before (a backup, a snapshot, a restored file) can then no
longer be read for that subject — each such value raises :class:`~statekeel.errors.SubjectErased` — while
every other subject reads as before. That only holds because the ring is not in the database: back the
ring up on its own (it is small), and never into the same archive as the database. Without a ring,
erasure deletes rows, and backups keep what they held.

The ring is a SQLite file, owner-only (0600, in a directory created 0700), written with ``secure_delete``
and a write-ahead log synced on every commit; after destroying keys it checkpoints and truncates that
log, so a destroyed key is neither in the file nor in its log. Every process of a store opens the same
ring file. It names owners by their SHA-256 only: the ring holds no session key, scope or subject in
clear.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import os
import sqlite3
import stat
import threading
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import InvalidArgument, KeyRingError
from .aead import KEY_BYTES, NONCE_BYTES, aead_for, check_keys, key_id

FORMAT = "1"
CHECK = b"statekeel key ring"
_CACHE = 4096  # unwrapped data keys kept per process (unwrapping again costs one read of the ring)

_SCHEMA = (
    "CREATE TABLE ring (name TEXT PRIMARY KEY, value BLOB NOT NULL)",
    "CREATE TABLE data_keys (key_id TEXT PRIMARY KEY, owner TEXT NOT NULL UNIQUE, wrapped_by TEXT NOT NULL, "
    "wrapped BLOB NOT NULL, created_at TEXT NOT NULL)",
    "CREATE TABLE destroyed (key_id TEXT PRIMARY KEY, destroyed_at TEXT NOT NULL)",
    # An erasure's owners, with their names sealed under the store key: the next run of an erasure killed
    # after the rows went reads them back to spare a session that stayed (its metadata changed meanwhile).
    "CREATE TABLE erasing (subject TEXT NOT NULL, owner TEXT NOT NULL, name BLOB NOT NULL, "
    "PRIMARY KEY (subject, owner))",
)


def owner_digest(name: str) -> str:
    """How the ring names a data key's owner (a session key or a memory scope): the SHA-256 of its text."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


def _wrap_ad(owner: str, kid: str) -> bytes:
    return b"statekeel data key\x00" + owner.encode("ascii") + b"\x00" + kid.encode("ascii")


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


def _path(path: Any) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgument(f"keyring must be a path, got {type(path).__name__}")
    name = os.fspath(path)
    if not isinstance(name, str) or not name:
        raise InvalidArgument("keyring must name a file")
    return os.path.abspath(name)


def _connect(path: str) -> sqlite3.Connection:
    # mode=rw: a ring that vanished between the checks and the open is an error, never a new empty file.
    uri = "file:" + urllib.parse.quote(path) + "?mode=rw"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        # A destroyed key is overwritten in the file (secure_delete), and the log that held it truncated
        # (see _scrub). WAL: making a key (once per session) costs one fsync, not a journal's three.
        conn.execute("PRAGMA secure_delete = ON")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
    except sqlite3.DatabaseError:
        conn.close()
        raise
    return conn


def _check_file(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise KeyRingError(
            f"key ring file {path} does not exist: restore it from its backup (a store whose data keys were "
            "in it cannot read those subjects without it), or create a new ring with "
            "statekeel.create_keyring(path, key) for a store that never had one",
            path=path,
            hint="",
        ) from None
    except OSError as exc:
        raise KeyRingError(f"cannot read key ring file {path}: {exc.strerror}", path=path) from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        raise KeyRingError(f"key ring {path} is not a regular file", path=path)
    if os.name == "posix" and st.st_mode & 0o077:
        raise KeyRingError(
            f"key ring file {path} is readable by others than its owner (mode {st.st_mode & 0o777:04o}): "
            f"refused; run chmod 600 {path}",
            path=path,
            hint="",
        )


class KeyRing:
    """An open key ring (see the module documentation). Made by :func:`open_keyring`; thread-safe (the
    store seals on its event loop and in worker threads)."""

    def __init__(self, path: str, conn: sqlite3.Connection, keys: tuple[bytes, ...]) -> None:
        self.path = path
        self._conn = conn
        self._lock = threading.Lock()
        self._wrappers = {key_id(k): aead_for(k) for k in keys}
        self._current = key_id(keys[0])
        self._cache: dict[str, Any] = {}  # key id -> AEAD
        self._owners: dict[str, str] = {}  # owner -> key id
        self._version = -1

    def _fresh(self) -> None:
        # Another process committed to the ring (a key made, or destroyed by an erasure): forget what is
        # remembered, so that a destroyed key opens nothing here either. Under the lock.
        version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._version:
            self._cache.clear()
            self._owners.clear()
            self._version = version

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # --- wrapping ------------------------------------------------------------------------------------------

    def _wrap(self, key: bytes, owner: str, kid: str) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        sealed: bytes = self._wrappers[self._current].encrypt(nonce, key, _wrap_ad(owner, kid))
        return nonce + sealed

    def _unwrap(self, kid: str, owner: str, wrapped_by: str, wrapped: bytes) -> bytes:
        wrapper = self._wrappers.get(wrapped_by)
        if wrapper is None:
            raise KeyRingError(
                f"data key {kid} in the key ring {self.path} is wrapped by store key id {wrapped_by}, which "
                f"is not among the keys given ({', '.join(self._wrappers)}): open the store with that key "
                "too (encryption_key=[new, old]) until rotate_encryption_key() has finished",
                path=self.path,
                key_id=wrapped_by,
                hint="",
            )
        from cryptography.exceptions import InvalidTag

        try:
            key: bytes = wrapper.decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], _wrap_ad(owner, kid))
        except InvalidTag:
            raise KeyRingError(
                f"data key {kid} in the key ring {self.path} does not authenticate under store key id "
                f"{wrapped_by}: the ring was altered; restore it from its backup",
                path=self.path,
                key_id=kid,
                hint="",
            ) from None
        if len(key) != KEY_BYTES or key_id(key) != kid:
            raise KeyRingError(f"data key {kid} in the key ring {self.path} is damaged", path=self.path)
        return key

    def _remember(self, kid: str, key: bytes) -> Any:
        if len(self._cache) >= _CACHE:
            self._cache.pop(next(iter(self._cache)))
        aead = self._cache[kid] = aead_for(key)
        return aead

    # --- what the cipher asks ------------------------------------------------------------------------------

    def sealing_key(self, name: str) -> tuple[str, Any]:
        """The id and AEAD of the data key of ``name`` (a session key or a memory scope), made and
        committed to the ring first if it has none. What is remembered is forgotten as soon as another
        process commits to the ring, so that a key it destroyed is never sealed under again."""
        owner = owner_digest(name)
        with self._lock:
            self._fresh()
            known = self._owners.get(owner)
            if known is not None and known in self._cache:
                return known, self._cache[known]
            row = self._conn.execute(
                "SELECT key_id, wrapped_by, wrapped FROM data_keys WHERE owner = ?", (owner,)
            ).fetchone()
            if row is None:
                key = os.urandom(KEY_BYTES)
                kid = key_id(key)
                # Committed (synced) before any value is sealed under it: a value never outlives its key.
                self._conn.execute(
                    "INSERT INTO data_keys (key_id, owner, wrapped_by, wrapped, created_at) VALUES "
                    "(?, ?, ?, ?, ?) ON CONFLICT (owner) DO NOTHING",
                    (kid, owner, self._current, self._wrap(key, owner, kid), _now()),
                )
                row = self._conn.execute(
                    "SELECT key_id, wrapped_by, wrapped FROM data_keys WHERE owner = ?", (owner,)
                ).fetchone()
            kid, wrapped_by, wrapped = row
            aead = self._cache.get(kid)
            if aead is None:
                aead = self._remember(kid, self._unwrap(kid, owner, wrapped_by, wrapped))
            if len(self._owners) >= _CACHE:
                self._owners.pop(next(iter(self._owners)))
            self._owners[owner] = kid
            return kid, aead

    def opening_key(self, kid: str) -> Any | None:
        """The AEAD of data key ``kid``, or None if the ring does not hold it (see :meth:`destroyed`)."""
        with self._lock:
            self._fresh()
            aead = self._cache.get(kid)
            if aead is not None:
                return aead
            row = self._conn.execute(
                "SELECT owner, wrapped_by, wrapped FROM data_keys WHERE key_id = ?", (kid,)
            ).fetchone()
            if row is None:
                return None
            return self._remember(kid, self._unwrap(kid, *row))

    def destroyed(self, kid: str) -> bool:
        """Whether data key ``kid`` was destroyed by an erasure."""
        with self._lock:
            return (
                self._conn.execute("SELECT 1 FROM destroyed WHERE key_id = ?", (kid,)).fetchone() is not None
            )

    def holds(self, kid: str) -> bool:
        """Whether ``kid`` is one of the ring's data keys."""
        with self._lock:
            self._fresh()
            if kid in self._cache:
                return True
            return (
                self._conn.execute("SELECT 1 FROM data_keys WHERE key_id = ?", (kid,)).fetchone() is not None
            )

    # --- erasure -------------------------------------------------------------------------------------------

    def count(self, names: Iterable[str]) -> int:
        """How many of ``names`` have a data key (what an erasure of them would destroy)."""
        owners = [owner_digest(n) for n in names]
        with self._lock:
            return sum(
                self._conn.execute("SELECT count(*) FROM data_keys WHERE owner = ?", (o,)).fetchone()[0]
                for o in owners
            )

    def mark(self, subject: str, names: Iterable[str]) -> None:
        """Record, before the rows go, that an erasure of ``subject`` (its SHA-256) destroys the data keys
        of ``names``: a run killed after deleting the rows (which named them) still knows, in the next
        run, which keys to destroy."""
        rows = [(subject, o, self._seal_name(subject, o, n)) for n in names for o in (owner_digest(n),)]
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany(
                    "INSERT INTO erasing (subject, owner, name) VALUES (?, ?, ?) ON CONFLICT DO NOTHING", rows
                )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def _seal_name(self, subject: str, owner: str, name: str) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        ad = b"statekeel erasing\x00" + subject.encode("ascii") + b"\x00" + owner.encode("ascii")
        sealed: bytes = self._wrappers[self._current].encrypt(nonce, name.encode("utf-8"), ad)
        return self._current.encode("ascii") + nonce + sealed

    def _open_name(self, subject: str, owner: str, blob: bytes) -> str:
        from cryptography.exceptions import InvalidTag

        wrapped_by = blob[:16].decode("ascii", "replace")
        wrapper = self._wrappers.get(wrapped_by)
        ad = b"statekeel erasing\x00" + subject.encode("ascii") + b"\x00" + owner.encode("ascii")
        try:
            if wrapper is None:
                raise InvalidTag
            name: bytes = wrapper.decrypt(blob[16 : 16 + NONCE_BYTES], blob[16 + NONCE_BYTES :], ad)
        except InvalidTag:
            raise KeyRingError(
                f"an erasure recorded in the key ring {self.path} cannot be read under the keys given "
                f"(sealed under store key id {wrapped_by}): open the store with that key too",
                path=self.path,
                key_id=wrapped_by,
                hint="",
            ) from None
        return name.decode("utf-8")

    def pending(self, subject: str) -> list[str]:
        """The names (session keys, scopes) whose data keys an erasure of ``subject`` marked."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT owner, name FROM erasing WHERE subject = ? ORDER BY owner", (subject,)
            ).fetchall()
        return [self._open_name(subject, owner, blob) for owner, blob in rows]

    def destroy(self, subject: str, spare: Iterable[str] = ()) -> int:
        """Destroy the data keys an erasure of ``subject`` marked (committed and synced, overwritten in
        the file), keeping their ids as destroyed, except those of ``spare`` (sessions that stayed); the
        number destroyed."""
        kept = [(subject, owner_digest(n)) for n in spare]
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                # A session that stayed (it no longer names the subject) keeps its key.
                self._conn.executemany("DELETE FROM erasing WHERE subject = ? AND owner = ?", kept)
                kids = [
                    kid
                    for (kid,) in self._conn.execute(
                        "SELECT key_id FROM data_keys WHERE owner IN "
                        "(SELECT owner FROM erasing WHERE subject = ?)",
                        (subject,),
                    )
                ]
                when = _now()
                self._conn.executemany(
                    "INSERT INTO destroyed (key_id, destroyed_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
                    [(kid, when) for kid in kids],
                )
                self._conn.execute(
                    "DELETE FROM data_keys WHERE owner IN (SELECT owner FROM erasing WHERE subject = ?)",
                    (subject,),
                )
                # Done: the subject's erasure no longer needs to remember whose keys to destroy.
                self._conn.execute("DELETE FROM erasing WHERE subject = ?", (subject,))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            for kid in kids:
                self._cache.pop(kid, None)
            self._owners.clear()
            self._scrub()
            return len(kids)

    def _scrub(self) -> None:
        # Copy the overwritten pages into the file and empty the log, whose older frames still hold the
        # destroyed keys; a reader of another process can hold it up for a moment (busy_timeout waits).
        for _ in range(10):
            busy, _log, _done = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                return
        raise KeyRingError(
            f"the key ring {self.path} could not be checkpointed (another process keeps reading it): the "
            "destroyed keys are deleted but their bytes may remain in its log; run the erasure again",
            path=self.path,
            hint="",
        )

    # --- rotation ------------------------------------------------------------------------------------------

    def rewrap(self) -> int:
        """Wrap every data key (and the ring's check value) under the current store key, in one
        transaction; the values sealed under the data keys are not touched. The number re-wrapped."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                rows = self._conn.execute(
                    "SELECT key_id, owner, wrapped_by, wrapped FROM data_keys WHERE wrapped_by != ?",
                    (self._current,),
                ).fetchall()
                for kid, owner, wrapped_by, wrapped in rows:
                    key = self._unwrap(kid, owner, wrapped_by, wrapped)
                    self._conn.execute(
                        "UPDATE data_keys SET wrapped_by = ?, wrapped = ? WHERE key_id = ?",
                        (self._current, self._wrap(key, owner, kid), kid),
                    )
                marks = self._conn.execute(
                    "SELECT subject, owner, name FROM erasing WHERE substr(name, 1, 16) != ?",
                    (self._current.encode("ascii"),),
                ).fetchall()
                for subject, owner, blob in marks:
                    self._conn.execute(
                        "UPDATE erasing SET name = ? WHERE subject = ? AND owner = ?",
                        (
                            self._seal_name(subject, owner, self._open_name(subject, owner, blob)),
                            subject,
                            owner,
                        ),
                    )
                self._conn.execute(
                    "UPDATE ring SET value = ? WHERE name = 'check'",
                    (_check_value(self._wrappers, self._current),),
                )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._scrub()  # the keys wrapped by the old store key go from the log too
            return len(rows)


def _check_value(wrappers: Mapping[str, Any], current: str) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    sealed: bytes = wrappers[current].encrypt(nonce, CHECK, CHECK)
    return current.encode("ascii") + nonce + sealed


def open_keyring(path: Any, encryption_key: Any) -> KeyRing:
    """Open the ring at ``path`` for a store with ``encryption_key`` (blocking, reads only): raises
    :class:`~statekeel.errors.KeyRingError`, before anything is written, when the file is missing, too open,
    not a ring, damaged, or made with a store key that is not among ``encryption_key``."""
    name = _path(path)
    keys = check_keys(encryption_key)
    _check_file(name)
    try:
        conn = _connect(name)
    except sqlite3.DatabaseError as exc:
        raise KeyRingError(f"key ring {name} cannot be opened ({exc})", path=name) from None
    try:
        ring = KeyRing(name, conn, keys)
        _verify(ring, conn, name)
    except BaseException:
        conn.close()
        raise
    return ring


def _verify(ring: KeyRing, conn: sqlite3.Connection, name: str) -> None:
    try:
        ok = conn.execute("PRAGMA quick_check").fetchone()[0]
        values = dict(conn.execute("SELECT name, value FROM ring"))
        conn.execute("SELECT key_id, owner, wrapped_by, wrapped FROM data_keys LIMIT 0")
        conn.execute("SELECT key_id FROM destroyed LIMIT 0")
        conn.execute("SELECT subject, owner, name FROM erasing LIMIT 0")
    except sqlite3.DatabaseError as exc:
        raise KeyRingError(
            f"{name} is not a statekeel key ring, or it is damaged ({exc})", path=name
        ) from None
    if ok != "ok":
        raise KeyRingError(f"key ring {name} is damaged (SQLite integrity check: {ok})", path=name)
    if values.get("format") != FORMAT:
        raise KeyRingError(
            f"key ring {name} has format {values.get('format')!r}; this statekeel reads format {FORMAT}: "
            "upgrade statekeel, or restore the ring from its backup",
            path=name,
            hint="",
        )
    check = values.get("check")
    if not isinstance(check, bytes) or len(check) < 16 + NONCE_BYTES:
        raise KeyRingError(f"key ring {name} is damaged (no check value)", path=name)
    wrapped_by = check[:16].decode("ascii", "replace")
    wrapper = ring._wrappers.get(wrapped_by)
    if wrapper is None:
        raise KeyRingError(
            f"key ring {name} was made with store key id {wrapped_by}, which is not among the keys given "
            f"({', '.join(ring._wrappers)}): open the store with the key the ring was made with (the current "
            "one first; the old ones after it while rotating)",
            path=name,
            key_id=wrapped_by,
            hint="",
        )
    from cryptography.exceptions import InvalidTag

    try:
        wrapper.decrypt(check[16 : 16 + NONCE_BYTES], check[16 + NONCE_BYTES :], CHECK)
    except InvalidTag:
        raise KeyRingError(
            f"key ring {name} does not authenticate under store key id {wrapped_by}: it was altered; restore "
            "it from its backup",
            path=name,
            key_id=wrapped_by,
            hint="",
        ) from None


def _create(path: Any, encryption_key: Any) -> str:
    name = _path(path)
    keys = check_keys(encryption_key)
    parent = os.path.dirname(name)
    if not os.path.isdir(parent):
        os.makedirs(parent, mode=0o700)
    if os.path.lexists(name):
        raise InvalidArgument(f"key ring {name} exists already: a ring is never overwritten", path=name)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    except FileExistsError:
        raise InvalidArgument(
            f"key ring {name} exists already: a ring is never overwritten", path=name
        ) from None
    os.close(fd)
    try:
        conn = _connect(name)
        try:
            conn.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA:
                conn.execute(statement)
            wrappers = {key_id(keys[0]): aead_for(keys[0])}
            conn.execute("INSERT INTO ring (name, value) VALUES ('format', ?)", (FORMAT,))
            conn.execute(
                "INSERT INTO ring (name, value) VALUES ('check', ?)",
                (_check_value(wrappers, key_id(keys[0])),),
            )
            conn.execute("COMMIT")
        finally:
            conn.close()
        dirfd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(dirfd)  # the new file's name is durable too
        finally:
            os.close(dirfd)
    except BaseException:
        os.unlink(name)
        raise
    return name


async def create_keyring(path: str | os.PathLike[str], encryption_key: bytes | list[bytes]) -> str:
    """Create a new, empty key ring at ``path`` for a store whose store key is ``encryption_key`` (its
    first key, if a list), owner-only (0600; a missing directory is created 0700), and return its absolute
    path. An existing file is never overwritten (``InvalidArgument``). Back the ring up apart from the
    database: see :mod:`statekeel.codec.keyring`."""
    return await asyncio.to_thread(_create, path, encryption_key)


__all__ = ["KeyRing", "create_keyring", "open_keyring", "owner_digest"]
