"""The file ledger: which files an agent changed, and whether they are still as it left them.

    digest, size = await checksum_file("/srv/repo/src/app.py")
    await store.files.record("src/app.py", digest, size, task_id=task.id)
    ...                                                   # crash, restart
    for drift in await store.files.check("/srv/repo"):    # "changed" or "missing"
        print(drift.path, drift.kind)

Critical tier: a record is committed before ``record`` returns, and every record is kept — the ledger is
the history of each path, not only its last state. Paths are stored relative to the project root,
normalised lexically to POSIX form (``./src//a.py`` → ``src/a.py``); a path that leaves the root
(``../x``, or an absolute path outside ``root``) is refused. The checksum is the SHA-256 hex digest of the
file's bytes, which is what :meth:`FileLedger.check` computes (in a worker thread, so hashing big files
never blocks the event loop).
"""

from __future__ import annotations

import asyncio
import builtins
import datetime as dt
import hashlib
import os
import posixpath
import re
import stat
from collections.abc import Sequence
from typing import Any

from .backends.base import FILE_ACTIONS, Drift, FileRecord, StorageBackend
from .errors import InvalidArgument
from .validation import check_int, check_key, check_text

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_CHUNK = 1 << 20
_PAGE = 500


def _hash(path: str) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


async def checksum_file(path: str | os.PathLike[str]) -> tuple[str, int]:
    """The SHA-256 hex digest and size in bytes of a file, read in a worker thread."""
    return await asyncio.to_thread(_hash, os.fspath(path))


def _text_path(value: Any, what: str) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if builtins.type(value) is not str:
        raise InvalidArgument(
            f"{what} must be text (a str or a pathlib.Path), got {builtins.type(value).__name__} {value!r}",
            value=value,
        )
    return check_text(value, what)


def _check_owner(task_id: Any, session_key: Any) -> None:
    """The optional task id and session key a record belongs to (or a query filters on) are keys."""
    if task_id is not None:
        check_key(task_id, "task_id")
    if session_key is not None:
        check_key(session_key, "session_key")


def normalize_path(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> str:
    """``path`` as the ledger stores it: relative to ``root``, lexically normalised, with ``/``.

    An absolute ``path`` needs ``root``; one that is not under ``root``, a relative one that climbs out of
    it (``../``), and one naming the root itself are refused with ``InvalidArgument``.
    """
    text = _text_path(path, "path")
    if os.path.isabs(text):
        if root is None:
            raise InvalidArgument(
                f"path {text!r} is absolute: pass root= (the directory it is relative to) or a relative path",
                path=text,
            )
        base = os.path.normpath(os.path.abspath(_text_path(root, "root")))
        text = os.path.relpath(os.path.normpath(text), base)
    if os.sep != "/":
        text = text.replace(os.sep, "/")
    norm = posixpath.normpath(text)
    if norm == "..":
        norm = "../"
    if norm.startswith("../") or norm.startswith("/"):
        raise InvalidArgument(f"path {path!r} leaves the root directory; record paths inside it", path=text)
    if norm == ".":
        raise InvalidArgument(f"path {path!r} names the root directory itself, not a file", path=text)
    return norm


def _inspect(root: str, records: Sequence[FileRecord]) -> list[Drift]:
    """Compare records with the files under ``root`` (runs in a worker thread)."""
    drifts: list[Drift] = []
    for record in records:
        full = os.path.join(root, *record.path.split("/"))
        try:
            info = os.stat(full)
        except (FileNotFoundError, NotADirectoryError):
            if record.action != "deleted":
                drifts.append(Drift(record.path, "missing", record))
            continue
        if not stat.S_ISREG(info.st_mode):
            drifts.append(Drift(record.path, "changed", record))
            continue
        try:
            digest, size = _hash(full)
        except FileNotFoundError:  # removed since the stat
            if record.action != "deleted":
                drifts.append(Drift(record.path, "missing", record))
            continue
        except OSError:
            drifts.append(Drift(record.path, "unreadable", record))
            continue
        if record.action == "deleted" or digest != record.checksum:
            drifts.append(Drift(record.path, "changed", record, digest, size))
    return drifts


class FileLedger:
    """Records file changes and compares the ledger with the disk. See the module documentation."""

    def __init__(self, backend: StorageBackend) -> None:
        self.backend = backend

    async def record(
        self,
        path: str | os.PathLike[str],
        checksum: str | None,
        size: int | None,
        *,
        task_id: str | None = None,
        session_key: str | None = None,
        action: str = "modified",
        root: str | os.PathLike[str] | None = None,
    ) -> FileRecord:
        """Record a change of ``path`` (relative, or absolute under ``root``): its new SHA-256 hex
        ``checksum`` and ``size`` in bytes. ``action`` is "created", "modified" or "deleted" (a deletion
        may give None for both). Committed before it returns."""
        rel = normalize_path(path, root)
        if builtins.type(action) is not str or action not in FILE_ACTIONS:
            raise InvalidArgument(f"action must be one of {', '.join(FILE_ACTIONS)}, got {action!r}")
        if action == "deleted" and checksum is None and size is None:
            digest, length = None, None
        else:
            if builtins.type(checksum) is not str or not _HEX64.fullmatch(checksum):
                raise InvalidArgument(
                    f"checksum must be the 64 hex digits of a SHA-256 digest, got {checksum!r}",
                    value=checksum,
                )
            digest, length = checksum.lower(), check_int(size, "size", minimum=0)
        _check_owner(task_id, session_key)
        return await self.backend.record_file(
            rel,
            checksum=digest,
            size=length,
            action=action,
            task_id=task_id,
            session_key=session_key,
            at=dt.datetime.now(dt.UTC),
        )

    async def list(
        self,
        task_id: str | None = None,
        *,
        session_key: str | None = None,
        path: str | os.PathLike[str] | None = None,
        root: str | os.PathLike[str] | None = None,
        limit: int | None = None,
    ) -> builtins.list[FileRecord]:
        """Every record matching the given filters, in the order they were recorded (all of them unless
        ``limit``)."""
        _check_owner(task_id, session_key)
        rel = None if path is None else normalize_path(path, root)
        if limit is not None:
            check_int(limit, "limit", minimum=1)
        return await self.backend.list_files(task_id=task_id, session_key=session_key, path=rel, limit=limit)

    async def latest(
        self,
        *,
        after_path: str = "",
        limit: int = 100,
        task_id: str | None = None,
        session_key: str | None = None,
    ) -> builtins.list[FileRecord]:
        """The last record of each path, in path order, from the first path after ``after_path`` (pass
        the last path of a page for the next one); at most ``limit``. With ``task_id`` / ``session_key``,
        only the paths that task or session recorded.

            page = await store.files.latest(limit=100)
            more = await store.files.latest(after_path=page[-1].path, limit=100)
        """
        if builtins.type(after_path) is not str:
            raise InvalidArgument(f"after_path must be a str (a path of a previous page), got {after_path!r}")
        check_int(limit, "limit", minimum=1)
        _check_owner(task_id, session_key)
        return await self.backend.last_file_records(
            after_path=after_path, limit=limit, task_id=task_id, session_key=session_key
        )

    async def compare(
        self, root: str | os.PathLike[str], records: Sequence[FileRecord]
    ) -> builtins.list[Drift]:
        """Which of ``records`` (last records of their paths, from :meth:`latest`) no longer match the
        files under ``root``, as :meth:`check` tells it: "changed", "missing" or "unreadable"; the
        others are unchanged. Reads the files only (hashed in a worker thread), never the store."""
        base = _text_path(root, "root")
        if not await asyncio.to_thread(os.path.isdir, base):
            raise InvalidArgument(f"root {base!r} is not a directory", root=base)
        if not records:
            return []
        return await asyncio.to_thread(_inspect, base, builtins.list(records))

    async def check(
        self,
        root: str | os.PathLike[str],
        *,
        task_id: str | None = None,
        session_key: str | None = None,
    ) -> builtins.list[Drift]:
        """Files under ``root`` whose state no longer matches their last record, in path order: "changed"
        (other content; or present again after a recorded deletion), "missing", or "unreadable". With
        ``task_id`` / ``session_key``, only the paths that task or session recorded."""
        base = _text_path(root, "root")
        if not await asyncio.to_thread(os.path.isdir, base):
            raise InvalidArgument(f"root {base!r} is not a directory", root=base)
        _check_owner(task_id, session_key)
        drifts: builtins.list[Drift] = []
        after = ""
        while True:
            page = await self.backend.last_file_records(
                after_path=after, limit=_PAGE, task_id=task_id, session_key=session_key
            )
            if page:
                # One worker thread per page: files are hashed off the event loop.
                drifts.extend(await asyncio.to_thread(_inspect, base, page))
            if len(page) < _PAGE:
                return drifts
            after = page[-1].path


__all__ = ["Drift", "FileLedger", "FileRecord", "checksum_file", "normalize_path"]
