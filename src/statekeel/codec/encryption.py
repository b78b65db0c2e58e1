"""Encryption at rest: message payloads, memory content and data, step results and approval arguments.

    store = await statekeel.open_store(url, encryption_key=key)            # key = os.urandom(32)
    store = await statekeel.open_store(url, encryption_key=[new, old])     # rotating: first one is current
    report = await store.rotate_encryption_key()                           # re-encrypts under ``new``

Each value is sealed with AES-256-GCM under a random 96-bit nonce. The stored form is a JSON object
``{"$sk": "enc", "v": base64(envelope)}`` (so it fits every backend's JSON column) whose envelope is::

    version (1 byte) | key id length (1 byte) | key id (ASCII) | nonce (12 bytes) | ciphertext + tag

The associated data is the envelope's header plus the record's identity — ``["message", session_key,
seq]``, ``["memory", id, "content"|"data"]``, ``["step", task_id, step_key]``, ``["approval", id]`` — so a
ciphertext copied into another row, or given another key id, fails authentication with
:class:`~statekeel.errors.DecryptionError` instead of decrypting into the wrong place. With a key
configured, a plaintext value found on read raises :class:`~statekeel.errors.PlaintextRefused` unless the
store was opened with ``encrypt_existing=True`` (the migration mode, in which
:meth:`~statekeel.Store.rotate_encryption_key` also encrypts plaintext rows).

A key id is derived from the key (:func:`key_id`): the store never holds a key, only the ids.

With a key ring (``open_store(url, encryption_key=key, keyring=path)``, see :mod:`statekeel.codec.keyring`),
messages and memories are sealed under per-subject data keys instead, named by their own key ids in the
same envelope; a value under a data key that an erasure destroyed raises
:class:`~statekeel.errors.SubjectErased`.
"""

from __future__ import annotations

import asyncio
import binascii
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import (
    DecryptionError,
    EncryptionError,
    InvalidArgument,
    PlaintextRefused,
    StatekeelError,
    SubjectErased,
)
from .aead import KEY_BYTES, NONCE_BYTES, aead_for, check_keys, key_id
from .keyring import KeyRing, open_keyring

if TYPE_CHECKING:
    from ..fallback import FallbackDir
    from ..resealing import Resealer
    from .tagged import Codec

VERSION = 1
TAG = "$sk"  # the codec's reserved key (statekeel.codec.TAG): a user object never carries it unescaped
ENVELOPE = "enc"

Identity = tuple[str | int, ...]


KEY_FILE_MAX_BYTES = 64 * 1024


def read_key_file(path: str | os.PathLike[str]) -> tuple[bytes, ...]:
    """The keys of a key file, current first, for ``encryption_key``: one key per line as 64 hex digits
    (``openssl rand -hex 32``); blank lines and lines starting with ``#`` are skipped. The file must be a
    regular file readable by its owner only (like ssh's private keys): one readable by group or others
    is refused. Raises ``InvalidArgument`` (never quoting the file's contents) when the file is missing,
    unreadable, too open, empty or holds a malformed or repeated key."""
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InvalidArgument(f"key file {name} does not exist", hint="") from None
    except OSError as exc:
        raise InvalidArgument(f"cannot read key file {name}: {exc.strerror}", hint="") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgument(f"key file {name} is not a regular file", hint="")
        # The mode of the file opened, not of the path looked at earlier (no check-then-use race).
        if os.name == "posix" and st.st_mode & 0o077:
            raise InvalidArgument(
                f"key file {name} is readable by others than its owner (mode {st.st_mode & 0o777:04o}): "
                f"refused; run chmod 600 {name}",
                hint="",
            )
        if st.st_size > KEY_FILE_MAX_BYTES:
            raise InvalidArgument(f"key file {name} is {st.st_size} bytes: not a key file", hint="")
        try:
            data = os.read(fd, KEY_FILE_MAX_BYTES + 1)
        except OSError as exc:
            raise InvalidArgument(f"cannot read key file {name}: {exc.strerror}", hint="") from None
    finally:
        os.close(fd)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise InvalidArgument(
            f"key file {name} is not text: write each key as 64 hex digits (openssl rand -hex 32)", hint=""
        ) from None
    keys: list[bytes] = []
    seen: dict[bytes, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        # The message says what is wrong with the line, never what it holds: it may be a key.
        try:
            key = bytes.fromhex(line) if len(line) == 2 * KEY_BYTES else None
        except ValueError:
            key = None
        if key is None:
            raise InvalidArgument(
                f"key file {name}, line {number}: not a key ({len(line)} characters); each line holds one "
                f"key of {2 * KEY_BYTES} hex digits (openssl rand -hex 32)",
                hint="",
            )
        if key in seen:
            raise InvalidArgument(
                f"key file {name}, line {number}: the same key as line {seen[key]}", hint=""
            )
        seen[key] = number
        keys.append(key)
    if not keys:
        raise InvalidArgument(
            f"key file {name} holds no key: write one key of {2 * KEY_BYTES} hex digits per line, the "
            "current key first (openssl rand -hex 32)",
            hint="",
        )
    return tuple(keys)


def _associated(header: bytes, kind: str, identity: Identity) -> bytes:
    return header + orjson.dumps([kind, *identity])


def _record(kind: str, identity: Identity) -> str:
    return f"{kind} {'/'.join(str(part) for part in identity)}"


def is_envelope(parsed: Any) -> bool:
    """True if a parsed stored value is an encryption envelope (not plaintext)."""
    return type(parsed) is dict and parsed.get(TAG) == ENVELOPE


class Cipher:
    """Seals and opens the values of encrypted fields. One per store, made from its ``encryption_key``."""

    __slots__ = (
        "_aeads", "_current", "_header", "_invalid_tag", "allow_plaintext", "key_id", "key_ids", "ring",
    )  # fmt: skip

    def __init__(
        self, keys: Sequence[bytes], *, allow_plaintext: bool = False, ring: KeyRing | None = None
    ) -> None:
        keys = check_keys(list(keys))
        self._aeads = {key_id(k): aead_for(k) for k in keys}
        self.key_ids = tuple(self._aeads)
        self.key_id = self.key_ids[0]
        self._current = self._aeads[self.key_id]
        kid = self.key_id.encode("ascii")
        self._header = bytes((VERSION, len(kid))) + kid
        self.allow_plaintext = allow_plaintext
        # With a key ring, the values of a subject are sealed under its data key (statekeel.codec.keyring).
        self.ring = ring
        from cryptography.exceptions import InvalidTag

        self._invalid_tag = InvalidTag

    def _owner(self, kind: str, identity: Identity, subject: str | None) -> str | None:
        # Whose data key seals a value: a message's session, a memory's scope (given as ``subject``).
        if self.ring is None:
            return None
        if subject is not None:
            return subject
        return str(identity[0]) if kind == "message" else None

    def _sealer(self, kind: str, identity: Identity, subject: str | None) -> tuple[bytes, Any]:
        owner = self._owner(kind, identity, subject)
        if owner is None or self.ring is None:
            return self._header, self._current
        kid, aead = self.ring.sealing_key(owner)
        raw = kid.encode("ascii")
        return bytes((VERSION, len(raw))) + raw, aead

    def seal(self, plaintext: bytes, kind: str, identity: Identity, subject: str | None = None) -> bytes:
        """The stored JSON form of ``plaintext`` (codec bytes) for the record ``kind`` + ``identity``:
        under the data key of its session (a message) or of ``subject`` (a memory's scope) when the store
        has a key ring, else under the current store key."""
        header, aead = self._sealer(kind, identity, subject)
        nonce = os.urandom(NONCE_BYTES)
        sealed = aead.encrypt(nonce, plaintext, _associated(header, kind, identity))
        envelope = binascii.b2a_base64(header + nonce + sealed, newline=False)
        return b'{"$sk":"enc","v":"' + envelope + b'"}'

    def sealing_key_id(self, kind: str, identity: Identity, subject: str | None = None) -> str:
        """The key id :meth:`seal` would seal this record under now."""
        owner = self._owner(kind, identity, subject)
        if owner is None or self.ring is None:
            return self.key_id
        return str(self.ring.sealing_key(owner)[0])

    def settled(self, stored: str | None, kind: str, identity: Identity, subject: str | None = None) -> bool:
        """Whether a value stored under key id ``stored`` needs no re-sealing by a rotation: it is under
        the key :meth:`seal` would use, or under a data key of the ring (rotation re-wraps those keys
        instead of re-encrypting what they seal)."""
        if stored is None:
            return False
        if stored == self.sealing_key_id(kind, identity, subject):
            return True
        return stored not in self._aeads and self.ring is not None and self.ring.holds(stored)

    def stored_key_id(self, parsed: Any, kind: str, identity: Identity) -> str | None:
        """The key id a parsed stored value is sealed under, or None for plaintext."""
        if not is_envelope(parsed):
            return None
        return self._split(parsed, kind, identity)[1]

    def _split(self, parsed: dict[str, Any], kind: str, identity: Identity) -> tuple[bytes, str, bytes]:
        try:
            blob = binascii.a2b_base64(parsed["v"], strict_mode=True)
            version, size = blob[0], blob[1]
            kid = blob[2 : 2 + size].decode("ascii")
        except (KeyError, TypeError, IndexError, ValueError, binascii.Error):
            raise DecryptionError(
                f"the encrypted {_record(kind, identity)} is malformed (not an envelope statekeel wrote)",
                kind=kind,
                record=list(identity),
                key_id=None,
            ) from None
        if version != VERSION:
            raise DecryptionError(
                f"the encrypted {_record(kind, identity)} has envelope version {version}; this statekeel "
                f"reads version {VERSION}: upgrade statekeel",
                kind=kind,
                record=list(identity),
                key_id=kid,
                hint="",
            )
        return blob[: 2 + size], kid, blob[2 + size :]

    def open_raw(self, parsed: Any, kind: str, identity: Identity) -> bytes:
        """The codec bytes of a parsed stored value; raises if it cannot be opened (or is refused)."""
        if not is_envelope(parsed):
            if self.allow_plaintext:
                return orjson.dumps(parsed)
            raise PlaintextRefused(
                f"the {_record(kind, identity)} is stored in plaintext, but this store is opened with an "
                "encryption key: refused",
                kind=kind,
                record=list(identity),
            )
        header, kid, rest = self._split(parsed, kind, identity)
        aead = self._aeads.get(kid)
        if aead is None and self.ring is not None:
            aead = self.ring.opening_key(kid)
            if aead is None and self.ring.destroyed(kid):
                raise SubjectErased(
                    f"the {_record(kind, identity)} is sealed under data key {kid}, which an erasure "
                    "destroyed: it is a copy of erased data and can no longer be read",
                    kind=kind,
                    record=list(identity),
                    key_id=kid,
                )
        if aead is None:
            raise DecryptionError(
                f"the {_record(kind, identity)} is encrypted under key id {kid}, which is not among the keys "
                f"given (key ids {', '.join(self.key_ids)})"
                + ("" if self.ring is None else " nor in the key ring"),
                kind=kind,
                record=list(identity),
                key_id=kid,
            )
        try:
            nonce, sealed = rest[:NONCE_BYTES], rest[NONCE_BYTES:]
            plain: bytes = aead.decrypt(nonce, sealed, _associated(header, kind, identity))
        except self._invalid_tag:
            raise DecryptionError(
                f"the {_record(kind, identity)} does not authenticate under key id {kid}: it was altered, or "
                "copied from another record",
                kind=kind,
                record=list(identity),
                key_id=kid,
            ) from None
        return plain

    def decode(self, codec: Codec, parsed: Any, kind: str, identity: Identity) -> Any:
        """The value of a parsed stored field (decrypted, then decoded by ``codec``)."""
        if not is_envelope(parsed) and self.allow_plaintext:
            return codec.from_json(parsed)
        return codec.decode(self.open_raw(parsed, kind, identity))


def make_cipher(
    encryption_key: Any, *, encrypt_existing: bool = False, keyring: str | os.PathLike[str] | None = None
) -> Cipher | None:
    """The store's cipher for its ``encryption_key`` option (None without a key), with the data keys of
    the key ring at ``keyring`` if given (opened here: a bad ring raises ``KeyRingError`` before the store
    writes anything)."""
    if encryption_key is None:
        if keyring is not None:
            raise InvalidArgument("keyring needs an encryption_key: the store key wraps the ring's data keys")
        return None
    keys = check_keys(encryption_key)
    ring = None
    if keyring is not None:
        ring = open_keyring(keyring, keys)
    return Cipher(keys, allow_plaintext=encrypt_existing, ring=ring)


# What rotate_encryption_key walks, in this order: a message moved to the archive, a memory event copied
# from its memory, while the walk runs, is met again in a later table.
ROTATION_TABLES = (
    "messages",
    "message_archive",
    "rewound_messages",
    "task_steps",
    "approvals",
    "memories",
    "memory_events",
)


@dataclass(frozen=True, slots=True)
class RotationReport:
    """What :meth:`~statekeel.Store.rotate_encryption_key` did: the current ``key_id``; per table the rows
    read (``scanned``) and the rows re-encrypted under the current key (``rewritten``, which counts
    plaintext rows encrypted in ``encrypt_existing`` mode too, and, with a key ring, rows moved from a
    store key to their subject's data key); the fallback files read (``fallback_files``) and those
    re-sealed under the current key (``fallback_resealed``); the key ring's data keys re-wrapped under
    the current key (``data_keys_rewrapped``)."""

    key_id: str
    scanned: Mapping[str, int] = field(default_factory=dict)
    rewritten: Mapping[str, int] = field(default_factory=dict)
    # The sessions' fallback files (saves made while the backend was unavailable) read, and re-sealed.
    fallback_files: int = 0
    fallback_resealed: int = 0
    # The key ring's data keys wrapped anew under the current key (what they seal is not re-encrypted).
    data_keys_rewrapped: int = 0

    @property
    def total_rewritten(self) -> int:
        return sum(self.rewritten.values())


RotationProgress = Callable[[str, int, int], object]


def reseal_fallback_files(files: FallbackDir | None) -> tuple[int, int]:
    """Re-seal every fallback file under the current key (blocking: run it in a thread); the files read
    and rewritten. A file that cannot be read stops the rotation with the error, saying what to do: until
    it is re-sealed, replayed or quarantined, the old key is still needed to read it."""
    if files is None:
        return 0, 0
    seen = resealed = 0
    for path in files.files():
        try:
            resealed += files.reseal(path)
        except (StatekeelError, OSError) as exc:
            kind = type(exc) if isinstance(exc, StatekeelError) else EncryptionError
            fields = exc.fields if isinstance(exc, StatekeelError) else {}
            raise kind(
                f"key rotation re-encrypted the database but cannot re-seal the fallback file {path} "
                f"({exc}); keep the old keys: replay the fallback files (store.recover(), which "
                "quarantines a file it cannot read) and run rotate_encryption_key() again",
                **{**fields, "path": path, "hint": ""},
            ) from exc
        seen += 1
    return seen, resealed


async def rotate(
    backend: Resealer,
    current: str,
    batch_size: int,
    on_batch: RotationProgress | None = None,
    fallback: FallbackDir | None = None,
    ring: KeyRing | None = None,
) -> RotationReport:
    """Re-seal every table's encrypted fields under the current key, batch by batch, then every fallback
    file (see :meth:`statekeel.Store.rotate_encryption_key`)."""
    scanned = dict.fromkeys(ROTATION_TABLES, 0)
    rewritten = dict.fromkeys(ROTATION_TABLES, 0)
    for table in ROTATION_TABLES:
        after: tuple[Any, ...] | None = None
        while True:
            page = await backend.reseal_rows(table, after=after, limit=batch_size)
            scanned[table] += page.scanned
            rewritten[table] += page.rewritten
            if on_batch is not None:
                on_batch(table, scanned[table], rewritten[table])
            if page.after is None:
                break
            after = page.after
    files, resealed = await asyncio.to_thread(reseal_fallback_files, fallback)
    rewrapped = 0 if ring is None else await asyncio.to_thread(ring.rewrap)
    return RotationReport(
        key_id=current,
        scanned=scanned,
        rewritten=rewritten,
        fallback_files=files,
        fallback_resealed=resealed,
        data_keys_rewrapped=rewrapped,
    )


__all__ = [
    "ROTATION_TABLES",
    "Cipher",
    "RotationProgress",
    "RotationReport",
    "check_keys",
    "is_envelope",
    "key_id",
    "make_cipher",
    "read_key_file",
    "reseal_fallback_files",
    "rotate",
]
