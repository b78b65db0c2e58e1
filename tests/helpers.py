"""Helpers shared by several test files (``tests/`` is on ``sys.path``: ``from helpers import ...``).

Fixtures live in ``conftest.py``; plain functions and constants live here.
"""

from __future__ import annotations

import contextlib
import math
import os
import sqlite3
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import statekeel
from statekeel.backends.base import NewMessage

# Text that no backend may store: NUL (PostgreSQL TEXT refuses it) and a lone surrogate (not UTF-8).
BAD_TEXT = ["a\x00b", "a\ud800b"]

# Floats a JSON number on PostgreSQL (JSONB ``numeric``) would turn into an int or lose the sign of, and
# ordinary ones.
FLOATS = [1e16, -1e16, 1.2345e20, 1e300, -1.7976931348623157e308, -0.0, 0.0, 1.0, 0.1, 1.5e-7, 5e-324]


def sqlite_url(path: str | os.PathLike[str]) -> str:
    return f"sqlite:///{os.fspath(path)}"


def exists(path: str) -> bool:
    """``os.path.exists`` under a name the async lint rules do not flag in async tests."""
    return os.access(path, os.F_OK)


def message(store: statekeel.Store, content: Any, role: str = "user") -> NewMessage:
    """A message as the backend contract takes it (``append_messages``)."""
    return NewMessage(role, store.codec.encode({"role": role, "content": content}))


async def contents(store: statekeel.Store, key: str) -> list[Any]:
    """The ``content`` of a session's live (not archived) messages, checking their seqs are dense."""
    found = await store.backend.load_session_with_messages(key)
    assert found is not None
    record, rows = found
    assert [r.seq for r in rows] == list(range(record.last_consolidated, record.head_seq))
    return [r.payload["content"] for r in rows]


async def granted_approval(
    store: statekeel.Store, subject: str, args: Any, requested_by: str
) -> statekeel.Approval:
    """An approval of ``shell`` with ``args`` on ``subject``, requested and granted (by alice)."""
    approval = await store.approvals.request(subject, "shell", args, requested_by)
    return await store.approvals.decide(approval.id, True, "alice", reason="build dir only")


def same_value(a: Any, b: Any) -> bool:
    """Equal, of the same type, and with the same sign for zeros (``-0.0 == 0.0`` in Python).

    Dict key order is not compared: PostgreSQL's JSONB gives keys back in its own order.
    """
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return bool(a == b)


@contextlib.contextmanager
def database_write_locked(db: Path) -> Iterator[None]:
    """Hold SQLite's write lock from another connection: every write of the store fails after its
    busy timeout with BackendUnavailable (reads still work: WAL)."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def run_together(commands: Sequence[Sequence[str]], *, timeout: float) -> list[str]:
    """Start one process per command, release them at the same moment, and return their outputs.

    Each process prints ``ready``, waits for a line on stdin (the barrier), works, and exits 0; a process
    that fails fails the test with its stderr. The returned outputs do not include the ``ready`` line.
    """
    procs = [
        subprocess.Popen(
            list(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:  # release them together
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = []
        for i, proc in enumerate(procs):
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, f"process {i} failed ({proc.returncode}):\n{err}"
            outputs.append(out)
        return outputs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


class RawDb:
    """A raw connection to a store's database (SQLite or PostgreSQL) that bypasses statekeel.

    ``unguarded`` names a table whose triggers are switched off around the statement (and restored in the
    same transaction): a change made behind statekeel's guards.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.pg = url.startswith("postgresql")

    async def execute(self, sql: str, *args: Any, unguarded: str | None = None) -> None:
        if self.pg:
            import asyncpg

            conn = await asyncpg.connect(self.url)
            try:
                async with conn.transaction():
                    if unguarded:
                        await conn.execute(f"ALTER TABLE {unguarded} DISABLE TRIGGER USER")
                    await conn.execute(sql.replace("?", "$1") if args else sql, *args)
                    if unguarded:
                        await conn.execute(f"ALTER TABLE {unguarded} ENABLE TRIGGER USER")
            finally:
                await conn.close()
            return
        conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                triggers = conn.execute(
                    "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?",
                    (unguarded,),
                ).fetchall()
                for name, _ in triggers:
                    conn.execute(f'DROP TRIGGER "{name}"')
                conn.execute(sql, args)
                for _, trigger_sql in triggers:
                    conn.execute(trigger_sql)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        finally:
            conn.close()

    async def refused(self, sql: str, *args: Any) -> str:
        """Run ``sql`` with the triggers in place; return the database's refusal message."""
        if self.pg:
            import asyncpg

            with pytest.raises(asyncpg.RestrictViolationError) as pg_info:
                await self.execute(sql, *args)
            return str(pg_info.value)
        with pytest.raises(sqlite3.IntegrityError) as info:
            await self.execute(sql, *args)
        return str(info.value)
