"""Encryption at rest: message payloads, memory content and data, step results and approval arguments are
sealed with AES-GCM bound to their record; plaintext, moved ciphertext and unknown keys fail typed; key
rotation runs in batches and resumes after an interruption."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import dataclasses
import logging
import os
import re
import sqlite3
import stat
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import statekeel
from helpers import database_write_locked, kill9_when, mariadb_raw
from statekeel.codec import Codec
from statekeel.codec.encryption import ROTATION_TABLES, VERSION, make_cipher
from statekeel.codec.keyring import open_keyring
from statekeel.fallback import FallbackDir, file_stem

Store = statekeel.Store
KEY_A = bytes(range(32))
KEY_B = bytes(range(100, 132))
KEY_C = bytes(range(200, 232))
SECRET = "PLAINTEXT-MARKER"
ARGS = {"cmd": f"rm -rf {SECRET}-args"}


class Opener:
    """Opens and reopens the store under test with other keys. ``memory://`` lives as long as its store,
    so there a reopen swaps the keys of the open store (what a new process with those keys would see)."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.url = url
        self.fallback = str(tmp_path / "fallback")
        self.store: Store | None = None

    async def open(self, key: Any = None, *, encrypt_existing: bool = False, keyring: Any = None) -> Store:
        if self.url == "memory://" and self.store is not None:
            old = self.store.codec.cipher
            if old is not None and old.ring is not None:
                old.ring.close()
            self.store.codec.cipher = make_cipher(key, encrypt_existing=encrypt_existing, keyring=keyring)
            return self.store
        await self.close()
        self.store = await statekeel.open_store(
            self.url,
            fallback_dir=self.fallback,
            encryption_key=key,
            encrypt_existing=encrypt_existing,
            keyring=keyring,
        )
        return self.store

    async def close(self) -> None:
        if self.store is not None and self.url != "memory://":
            await self.store.close()
            self.store = None

    async def raw(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """Run ``sql`` (``?1`` parameters) on the database itself, behind statekeel's back."""
        if self.url.startswith("postgresql"):
            import asyncpg

            conn = await asyncpg.connect(self.url)
            try:
                return [tuple(r) for r in await conn.fetch(re.sub(r"\?(\d)", r"$\1", sql), *args)]
            finally:
                await conn.close()
        if self.url.startswith("mariadb"):
            return await mariadb_raw(self.url, sql.replace(" AS TEXT)", " AS CHAR)"), *args)
        if self.url == "memory://":
            assert self.store is not None

            async def op(tx: Any) -> list[tuple[Any, ...]]:
                return [tuple(r) for r in tx.conn.execute(sql, args).fetchall()]

            return await self.store.backend._write(op)  # type: ignore[attr-defined,no-any-return]
        conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            return [tuple(r) for r in conn.execute(sql, args).fetchall()]
        finally:
            conn.close()


@pytest.fixture
async def opener(store_url: str, tmp_path: Path) -> AsyncIterator[Opener]:
    o = Opener(store_url, tmp_path)
    try:
        yield o
    finally:
        if o.store is not None:
            await o.store.close()


async def fill(store: Store) -> dict[str, str]:
    """One record of every encrypted kind, each holding the marker; their ids."""
    async with store.sessions.open("s") as session:
        for i in range(4):
            session.add_message("user", f"{SECRET}-message-{i}", n=i)
    await store.sessions.compress("s", 1, "summary")  # message 0 moves to the archive
    memory = await store.memory.put("user", "name", f"{SECRET}-memory", data={"note": f"{SECRET}-data"})
    await store.memory.put("user", "name", f"{SECRET}-memory-v2")  # history holds v1 and v2
    other = await store.memory.put("semantic", "other", "another memory")
    task = await store.tasks.create("t")
    await store.tasks.step(task.id, "fetch", lambda: {"out": f"{SECRET}-step"})
    await store.tasks.step(task.id, "other", lambda: {"out": "another step"})
    approval = await store.approvals.request("task:1", "shell", ARGS, "agent")
    await store.approvals.decide(approval.id, True, "alice")
    await store.approvals.request("task:1", "shell", {"cmd": "ls"}, "agent")
    return {"memory": memory.id, "other": other.id, "task": task.id, "approval": approval.id}


async def check_all(store: Store, ids: dict[str, str]) -> None:
    """Every record of :func:`fill` reads back as written (from storage, not from a cache)."""
    live = await store.backend.read_messages("s", start=1)
    assert [m.payload["content"] for m in live] == [f"{SECRET}-message-{i}" for i in (1, 2, 3)]
    archived = await store.sessions.archived("s")
    assert [m.payload for m in archived] == [{"role": "user", "content": f"{SECRET}-message-0", "n": 0}]
    memory = await store.memory.get(ids["memory"])
    assert memory is not None and memory.content == f"{SECRET}-memory-v2" and memory.data is None
    history = await store.memory.history(ids["memory"])
    assert [(e.old, e.new) for e in history] == [
        (None, f"{SECRET}-memory"),
        (f"{SECRET}-memory", f"{SECRET}-memory-v2"),
    ]
    assert history[0].after is not None and history[0].after["data"] == {"note": f"{SECRET}-data"}
    step = await store.backend.get_step(ids["task"], "fetch")
    assert step is not None and step.result == {"out": f"{SECRET}-step"}
    found = await store.approvals.check("task:1", "shell", ARGS)
    assert found is not None and found.id == ids["approval"] and found.args == ARGS


ENCRYPTED = """
SELECT CAST(payload AS TEXT) FROM messages UNION ALL SELECT CAST(payload AS TEXT) FROM message_archive
UNION ALL SELECT CAST(content AS TEXT) FROM memories UNION ALL SELECT CAST(data AS TEXT) FROM memories
UNION ALL SELECT CAST(state AS TEXT) FROM memory_events UNION ALL SELECT CAST(result AS TEXT) FROM task_steps
UNION ALL SELECT CAST(args AS TEXT) FROM approvals
"""


def envelope_prefix(key: bytes) -> str:
    """The base64 text every value sealed under ``key`` starts with (its header is 18 bytes)."""
    kid = statekeel.key_id(key).encode()
    return base64.b64encode(bytes((VERSION, len(kid))) + kid).decode()


async def test_each_encrypted_kind_round_trips(opener: Opener) -> None:
    store = await opener.open(KEY_A)
    ids = await fill(store)
    await check_all(store, ids)
    assert await store.approvals.consume(ids["approval"], "agent")
    memory = await store.memory.put("user", "name", f"{SECRET}-memory-v2")  # unchanged: no new version
    assert memory.version == 2
    store = await opener.open(KEY_A)  # another process with the same key
    loaded = await store.sessions.load("s")
    assert loaded is not None
    assert [m["content"] for m in loaded.history(max_messages=10)] == [
        f"{SECRET}-message-{i}" for i in (1, 2, 3)
    ]


async def test_stored_values_hold_no_plaintext(opener: Opener) -> None:
    store = await opener.open(KEY_A)
    await fill(store)
    values = [v for (v,) in await opener.raw(ENCRYPTED) if v is not None]
    # 3 live messages, 1 archived, 2 memories (no data left), 3 memory events, 2 step results, 2 approvals
    assert len(values) == 13
    for value in values:
        assert SECRET not in value
        assert envelope_prefix(KEY_A) in value
    if opener.url.startswith("sqlite"):
        await opener.close()
        path = Path(opener.url.removeprefix("sqlite:///"))
        on_disk = b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
        assert SECRET.encode() not in on_disk
        assert b"another step" not in on_disk  # unmarked values too


async def test_a_ciphertext_moved_to_another_record_fails_with_decryption_error(opener: Opener) -> None:
    store = await opener.open(KEY_A)
    ids = await fill(store)
    other_approval = (await store.approvals.pending())[0]
    moves = [
        ("UPDATE messages SET payload = (SELECT payload FROM messages WHERE seq = 1) WHERE seq = 2", ()),
        (
            "UPDATE memories SET content = (SELECT content FROM memories WHERE id = ?1) WHERE id = ?2",
            (ids["memory"], ids["other"]),
        ),
        (
            "UPDATE task_steps SET result = (SELECT result FROM task_steps WHERE step_key = 'fetch') "
            "WHERE step_key = 'other'",
            (),
        ),
        (
            "UPDATE approvals SET args = (SELECT args FROM approvals WHERE id = ?1) WHERE id = ?2",
            (ids["approval"], other_approval.id),
        ),
    ]
    for sql, args in moves:
        await opener.raw(sql, *args)
    store = await opener.open(KEY_A)
    with pytest.raises(statekeel.DecryptionError) as info:
        await store.backend.read_messages("s", start=1)
    assert (info.value.kind, info.value.record, info.value.key_id) == (
        "message",
        ["s", 2],
        statekeel.key_id(KEY_A),
    )
    with pytest.raises(statekeel.DecryptionError, match="copied from another record") as info:
        await store.memory.get(ids["other"])
    assert info.value.record == [ids["other"], "content"]
    with pytest.raises(statekeel.DecryptionError) as info:
        await store.backend.get_step(ids["task"], "other")
    assert info.value.kind == "step"
    with pytest.raises(statekeel.DecryptionError):
        await store.approvals.get(other_approval.id)
    # The records left in place still read.
    assert (await store.backend.get_step(ids["task"], "fetch")) is not None
    assert (await store.approvals.check("task:1", "shell", ARGS)) is not None


async def test_plaintext_is_refused_under_a_key_until_encrypted_in_place(opener: Opener) -> None:
    store = await opener.open(None)
    ids = await fill(store)
    store = await opener.open(KEY_A)
    with pytest.raises(statekeel.PlaintextRefused) as info:
        await store.memory.get(ids["memory"])
    assert (info.value.kind, info.value.record) == ("memory", [ids["memory"], "content"])
    with pytest.raises(statekeel.PlaintextRefused):
        await store.backend.read_messages("s", start=1)
    with pytest.raises(statekeel.PlaintextRefused):
        await store.approvals.check("task:1", "shell", ARGS)
    with pytest.raises(statekeel.PlaintextRefused):
        await store.rotate_encryption_key()

    store = await opener.open(KEY_A, encrypt_existing=True)
    await check_all(store, ids)  # mixed plaintext reads in this mode
    report = await store.rotate_encryption_key(batch_size=2)
    assert report.key_id == statekeel.key_id(KEY_A)
    assert report.rewritten == {
        "messages": 3,
        "message_archive": 1,
        "rewound_messages": 0,
        "task_steps": 2,
        "approvals": 2,
        "memories": 2,
        "memory_events": 3,
    }
    assert (await store.rotate_encryption_key()).total_rewritten == 0  # done: nothing left

    store = await opener.open(KEY_A)
    await check_all(store, ids)
    assert all(SECRET not in v for (v,) in await opener.raw(ENCRYPTED) if v is not None)


async def test_rotation_interrupted_between_batches_resumes_and_then_needs_only_the_new_key(
    opener: Opener,
) -> None:
    store = await opener.open(KEY_A)
    ids = await fill(store)
    store = await opener.open([KEY_B, KEY_A])
    real = store.backend.reseal_rows
    calls = 0

    async def failing_after_three(table: str, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls > 3:
            raise statekeel.BackendUnavailable("injected: the process died between two batches")
        return await real(table, **kw)

    store.backend.reseal_rows = failing_after_three  # type: ignore[method-assign]
    with pytest.raises(statekeel.BackendUnavailable, match="injected"):
        await store.rotate_encryption_key(batch_size=1)
    del store.backend.reseal_rows  # the backend's own method again
    values = [v for (v,) in await opener.raw(ENCRYPTED) if v is not None]
    under_b = sum(envelope_prefix(KEY_B) in v for v in values)
    assert under_b == 3  # the three batches (of messages) committed before the failure stay done
    await check_all(store, ids)  # both keys open every value meanwhile

    report = await store.rotate_encryption_key(batch_size=1)
    assert report.total_rewritten == len(values) - under_b
    store = await opener.open(KEY_B)
    await check_all(store, ids)
    assert (await store.audit.verify()).ok


async def test_rotation_reports_each_committed_batch_to_on_batch(opener: Opener) -> None:
    store = await opener.open(KEY_A)
    await fill(store)
    store = await opener.open([KEY_B, KEY_A])
    with pytest.raises(statekeel.InvalidArgument, match="on_batch must be callable"):
        await store.rotate_encryption_key(on_batch=3)  # type: ignore[arg-type]
    seen: list[tuple[str, int, int]] = []
    report = await store.rotate_encryption_key(batch_size=1, on_batch=lambda *counts: seen.append(counts))
    assert list(dict.fromkeys(table for table, _, _ in seen)) == list(ROTATION_TABLES)
    last = {table: (scanned, rewritten) for table, scanned, rewritten in seen}
    assert last == {t: (report.scanned[t], report.rewritten[t]) for t in ROTATION_TABLES}
    messages = [scanned for table, scanned, _ in seen if table == "messages"]
    assert messages == sorted(messages) and len(messages) >= report.scanned["messages"]  # one row a batch


async def test_a_wrong_key_raises_decryption_error_naming_the_stored_key_id(opener: Opener) -> None:
    store = await opener.open(KEY_A)
    ids = await fill(store)
    store = await opener.open(KEY_B)
    with pytest.raises(statekeel.DecryptionError, match=statekeel.key_id(KEY_A)) as info:
        await store.memory.get(ids["memory"])
    assert info.value.key_id == statekeel.key_id(KEY_A)
    store = await opener.open(None)
    with pytest.raises(statekeel.DecryptionError, match="opened without an encryption key"):
        await store.approvals.get(ids["approval"])


async def test_audit_verifies_over_encrypted_approvals_before_and_after_rotation(opener: Opener) -> None:
    store = await opener.open(KEY_A)
    used = await store.approvals.request("task:8", "deploy", ARGS, "agent")
    await store.approvals.decide(used.id, True, "alice")
    await store.approvals.consume(used.id, "agent")  # settled rows are re-encrypted too
    approval = await store.approvals.request("task:9", "deploy", ARGS, "agent")
    await store.approvals.decide(approval.id, True, "alice")
    verification = await store.audit.verify()
    assert verification.ok and verification.approvals == 2
    store = await opener.open([KEY_B, KEY_A])
    assert (await store.rotate_encryption_key()).rewritten["approvals"] == 2
    store = await opener.open(KEY_B)
    assert (await store.audit.verify()).ok
    assert (await store.approvals.consume(approval.id, "agent")).consumed_by == "agent"
    assert (await store.approvals.get(used.id)).args == ARGS  # type: ignore[union-attr]
    assert (await store.audit.verify()).ok


async def test_recover_answers_orphaned_tool_calls_of_an_encrypted_session(opener: Opener) -> None:
    store = await opener.open(KEY_A)
    session = await store.sessions.get_or_create("agent")
    session.add_message("user", f"{SECRET} run the tests")
    call = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
    session.add_message("assistant", None, tool_calls=[call])
    await store.sessions.save(session)
    report = await store.recover()
    assert report.orphaned_tool_calls == {"agent": ["c1"]}
    messages = await store.backend.read_messages("agent")
    assert [m.payload["role"] for m in messages] == ["user", "assistant", "tool"]
    assert all(SECRET not in v for (v,) in await opener.raw("SELECT CAST(payload AS TEXT) FROM messages"))


async def test_a_copy_of_an_encrypted_store_reads_with_the_same_key_only(
    opener: Opener, tmp_path: Path
) -> None:
    store = await opener.open(KEY_A)
    ids = await fill(store)
    url = f"sqlite:///{tmp_path / 'copy.db'}"
    async with statekeel.open_store(url, encryption_key=KEY_A) as copy:
        await statekeel.copy_store(store, copy)
        await check_all(copy, ids)
    async with statekeel.open_store(url, encryption_key=KEY_B) as copy:
        with pytest.raises(statekeel.DecryptionError):
            await copy.memory.get(ids["memory"])


async def test_a_save_during_an_outage_goes_to_a_sealed_fallback_file_and_is_replayed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db, fb = tmp_path / "store.db", tmp_path / "fallback"
    url = f"sqlite:///{db}"
    async with statekeel.open_store(
        url, fallback_dir=str(fb), busy_timeout_ms=50, encryption_key=KEY_A
    ) as store:
        session = await store.sessions.get_or_create("s")
        session.add_message("user", "before")
        await store.sessions.save(session)
        with database_write_locked(db), caplog.at_level(logging.WARNING, "statekeel.sessions"):
            session.add_message("assistant", f"{SECRET}-during")
            await store.sessions.save(session)  # the database is locked: the fallback file takes it
            (name,) = os.listdir(fb)
            on_disk = (fb / name).read_bytes()
            assert SECRET.encode() not in on_disk and envelope_prefix(KEY_A).encode() in on_disk
            other = statekeel.SessionManager(store.backend, store.codec, fallback_dir=fb)
            seen = await other.load("s")  # a manager without a cache merges the file
            assert seen is not None and [m["content"] for m in seen.messages] == [
                "before",
                f"{SECRET}-during",
            ]
            with pytest.raises(statekeel.DecryptionError):  # another key does not open the file
                FallbackDir(fb, Codec(cipher=make_cipher(KEY_B))).read("s")
        assert (await store.sessions.replay_fallback()).replayed == {"s": 1}
        assert [m.payload["content"] for m in await store.backend.read_messages("s")] == [
            "before",
            f"{SECRET}-during",
        ]


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        (b"short", "must be 32 bytes"),
        ("a string key of thirty-two chars", "must be 32 bytes"),
        ([], "non-empty list"),
        ([KEY_A, KEY_A], "the same key twice"),
    ],
)
async def test_an_unusable_key_is_refused_before_anything_is_opened(key: Any, problem: str) -> None:
    with pytest.raises(statekeel.InvalidArgument, match=problem):
        statekeel.open_store("memory://", encryption_key=key)


async def test_the_keys_never_appear_in_the_store_options_repr(opener: Opener) -> None:
    store = await opener.open([KEY_B, KEY_A])
    shown = repr(store.options) + repr(store.codec.cipher)
    assert repr(KEY_A) not in shown and repr(KEY_B) not in shown and KEY_A.hex() not in shown


async def test_a_key_without_the_cryptography_package_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
    with pytest.raises(statekeel.EncryptionError, match=re.escape("pip install 'statekeel[encryption]'")):
        await statekeel.open_store("memory://", encryption_key=KEY_A)


ROTATE_CHILD = textwrap.dedent(
    """
    import asyncio, sys, statekeel
    async def main():
        keys = [bytes(range(100, 132)), bytes(range(32))]
        store = await statekeel.open_store(sys.argv[1], encryption_key=keys)
        await store.rotate_encryption_key(batch_size=1)
    asyncio.run(main())
    """
)
UNDER_KEY = "SELECT count(*) FROM messages WHERE CAST(payload AS TEXT) LIKE ?1"


async def test_rotation_killed_by_sigkill_is_finished_by_running_it_again(
    shared_url: str, tmp_path: Path
) -> None:
    opener = Opener(shared_url, tmp_path)
    store = await opener.open(KEY_A)
    async with store.sessions.open("big") as session:
        for i in range(3000):
            session.add_message("user", f"{SECRET}-{i}")
    await opener.close()
    pattern = "%" + envelope_prefix(KEY_B) + "%"

    def under_b() -> int:
        # Polled from the blocked test loop: the query runs on a loop of its own.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            rows = pool.submit(asyncio.run, opener.raw(UNDER_KEY, pattern)).result()
        return int(rows[0][0])

    kill9_when(
        ["import sys; sys.argv[1:] = [sys.argv[-1]]\n" + ROTATE_CHILD, shared_url],
        lambda: under_b() >= 20,
        "re-encryption",
    )
    done = under_b()
    assert 20 <= done < 3000
    store = await opener.open([KEY_B, KEY_A])
    report = await store.rotate_encryption_key()
    assert report.rewritten["messages"] == 3000 - done
    store = await opener.open(KEY_B)
    messages = await store.backend.read_messages("big")
    assert [m.payload["content"] for m in messages] == [f"{SECRET}-{i}" for i in range(3000)]
    await opener.close()


# --- key rotation and the sessions' fallback files ----------------------------------------------------------


async def _saved_during_an_outage(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Session "s" has one message in the backend and one only in its fallback file; session "new" exists
    only in its fallback file (the backend refused both saves)."""
    s = await store.sessions.get_or_create("s")
    s.add_message("user", "before")
    await store.sessions.save(s)

    async def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise statekeel.BackendUnavailable("the database is down")

    monkeypatch.setattr(store.backend, "append_messages", unavailable)
    s.add_message("assistant", f"{SECRET}-during")
    await store.sessions.save(s)
    new = await store.sessions.get_or_create("new")
    new.add_message("user", f"{SECRET}-new")
    await store.sessions.save(new)
    monkeypatch.undo()
    assert s.fallback_file is not None and new.fallback_file is not None


def _fallback_bytes(opener: Opener) -> dict[str, bytes]:
    return {name: (Path(opener.fallback) / name).read_bytes() for name in sorted(os.listdir(opener.fallback))}


async def test_rotation_reseals_fallback_files_so_the_new_key_alone_reads_them(
    opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await opener.open(KEY_A)
    await _saved_during_an_outage(store, monkeypatch)
    assert all(envelope_prefix(KEY_A).encode() in data for data in _fallback_bytes(opener).values())
    store = await opener.open([KEY_B, KEY_A])
    report = await store.rotate_encryption_key()
    assert (report.fallback_files, report.fallback_resealed) == (2, 2)
    for data in _fallback_bytes(opener).values():
        assert envelope_prefix(KEY_A).encode() not in data and envelope_prefix(KEY_B).encode() in data
        assert SECRET.encode() not in data
    again = await store.rotate_encryption_key()  # nothing left to do
    assert (again.fallback_files, again.fallback_resealed) == (2, 0)
    store = await opener.open(KEY_B)  # the old key is dropped, as the docs allow
    fresh = statekeel.SessionManager(store.backend, store.codec, fallback_dir=opener.fallback)
    s = await fresh.load("s")
    new = await fresh.load("new")
    assert s is not None and [m["content"] for m in s.messages] == ["before", f"{SECRET}-during"]
    assert new is not None and [m["content"] for m in new.messages] == [f"{SECRET}-new"]
    report_replay = await store.sessions.replay_fallback()
    assert report_replay.replayed == {"s": 1, "new": 1} and report_replay.ok
    assert [m.payload["content"] for m in await store.backend.read_messages("s")] == [
        "before",
        f"{SECRET}-during",
    ]


async def test_rotation_keeps_the_signature_so_the_session_holding_a_fallback_file_saves_without_conflict(
    opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await opener.open(KEY_A)
    await _saved_during_an_outage(store, monkeypatch)
    store = await opener.open([KEY_B, KEY_A])
    await store.rotate_encryption_key()
    s = await store.sessions.load("s")  # holds the re-sealed file: the same one it read
    assert s is not None and s.fallback_file is not None
    s.add_message("user", "after")
    await store.sessions.save(s)
    assert s.fallback_file is None
    assert [m.payload["content"] for m in await store.backend.read_messages("s")] == [
        "before",
        f"{SECRET}-during",
        "after",
    ]


async def test_rotation_refuses_to_finish_while_a_fallback_file_cannot_be_resealed_and_leaves_it_as_is(
    opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await opener.open(KEY_A)
    await _saved_during_an_outage(store, monkeypatch)
    # Another process wrote session "new"'s file under a key the rotating store does not have.
    snap = FallbackDir(opener.fallback, Codec(cipher=make_cipher(KEY_A))).read("new")
    assert snap is not None
    FallbackDir(opener.fallback, Codec(cipher=make_cipher(KEY_C))).write(snap)
    before = _fallback_bytes(opener)
    store = await opener.open([KEY_B, KEY_A])
    with pytest.raises(statekeel.DecryptionError, match="cannot re-seal the fallback file") as info:
        await store.rotate_encryption_key()
    assert "keep the old keys" in str(info.value) and info.value.path.startswith(opener.fallback)
    name = os.path.basename(info.value.path)
    assert name == file_stem("new") + ".jsonl"
    assert _fallback_bytes(opener)[name] == before[name]  # that file is left as it was


async def test_rotation_re_reads_a_fallback_file_replaced_while_it_was_resealed_and_keeps_the_new_one(
    opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await opener.open(KEY_A)
    await _saved_during_an_outage(store, monkeypatch)
    store = await opener.open([KEY_B, KEY_A])
    files = store.sessions.fallback
    assert files is not None
    path = files.file_for("new")
    parse = files.parse
    other = FallbackDir(opener.fallback, Codec(cipher=make_cipher(KEY_A)))  # another process's writer
    replaced: list[str] = []

    def another_writer_in_between(at: str, data: bytes) -> Any:
        # Between the rotation's read of the file and its compare-and-swap, another save replaces it.
        snap = parse(at, data)
        if at == path and not replaced:
            replaced.append(other.write(dataclasses.replace(snap, messages=[*snap.messages, meanwhile])))
        return snap

    meanwhile = {"role": "user", "content": "written meanwhile"}
    monkeypatch.setattr(files, "parse", another_writer_in_between)
    report = await store.rotate_encryption_key()
    monkeypatch.undo()
    assert report.fallback_resealed == 2
    assert replaced == [path]
    snap = FallbackDir(opener.fallback, Codec(cipher=make_cipher(KEY_B))).read("new")  # the new key alone
    assert snap is not None and [m["content"] for m in snap.messages] == [
        f"{SECRET}-new",
        "written meanwhile",
    ]


async def test_rotation_reseals_rewound_messages_and_forks_copies(opener: Opener) -> None:
    store = await opener.open(KEY_A)
    async with store.sessions.open("r") as session:
        for i in range(4):
            session.add_message("user", f"{SECRET}-turn-{i}")
    fork = await store.sessions.fork("r", 3, new_key="r-fork")
    rewind = await store.sessions.rewind("r", 1, reason="undo")  # the fork gets its own copy of 1..2
    store = await opener.open([KEY_B, KEY_A])
    report = await store.rotate_encryption_key()
    assert report.rewritten["rewound_messages"] == 3
    store = await opener.open(KEY_B)
    archived = await store.sessions.archived("r", rewind.compression_id)
    assert [m.payload["content"] for m in archived] == [f"{SECRET}-turn-{i}" for i in (1, 2, 3)]
    store.sessions._cache.clear()
    loaded = await store.sessions.load(fork.key)
    assert loaded is not None
    assert [m["content"] for m in loaded.messages] == [f"{SECRET}-turn-{i}" for i in range(3)]


# --- the key ring: per-subject data keys -----------------------------------------------------------------


def stored_key_ids(values: list[str]) -> set[str]:
    """The key ids that stored envelopes (JSON text) name."""
    ids = set()
    for value in values:
        parsed = orjson.loads(value)
        if isinstance(parsed, dict) and parsed.get("$sk") == "enc":
            blob = base64.b64decode(parsed["v"])
            ids.add(blob[2 : 2 + blob[1]].decode())
    return ids


async def sealed_under(opener: Opener, sql: str) -> set[str]:
    return stored_key_ids([v for (v,) in await opener.raw(sql) if v is not None])


MESSAGE_VALUES = (
    "SELECT CAST(payload AS TEXT) FROM messages UNION ALL SELECT CAST(payload AS TEXT) FROM message_archive"
)
MEMORY_VALUES = "SELECT CAST(content AS TEXT) FROM memories"
STORE_KEY_VALUES = (
    "SELECT CAST(result AS TEXT) FROM task_steps UNION ALL SELECT CAST(args AS TEXT) FROM approvals"
)


async def test_with_a_key_ring_sessions_and_scopes_are_sealed_under_data_keys_of_their_own(
    opener: Opener, tmp_path: Path
) -> None:
    ring = await statekeel.create_keyring(tmp_path / "keys" / "ring.db", KEY_A)
    store = await opener.open(KEY_A, keyring=ring)
    ids = await fill(store)
    async with store.sessions.open("t") as other:
        other.add_message("user", "another session")
    await check_all(store, ids)
    store = await opener.open(KEY_A, keyring=ring)  # another process with the same key and ring
    await check_all(store, ids)
    store_key = statekeel.key_id(KEY_A)
    # Two sessions, two data keys; memories of scope "global" under a third; neither is the store key.
    messages = await sealed_under(opener, MESSAGE_VALUES)
    memories = await sealed_under(opener, MEMORY_VALUES)
    assert len(messages) == 2 and len(memories) == 1 and store_key not in messages | memories
    assert not messages & memories
    # Step results and approval arguments belong to no subject: the store key seals them, as before.
    assert await sealed_under(opener, STORE_KEY_VALUES) == {store_key}
    assert all(SECRET not in v for (v,) in await opener.raw(ENCRYPTED) if v is not None)
    assert stat.S_IMODE(os.stat(ring).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "keys").st_mode) == 0o700


async def test_rotation_rewraps_data_keys_so_the_new_store_key_alone_reads_everything(
    opener: Opener, tmp_path: Path
) -> None:
    ring = await statekeel.create_keyring(tmp_path / "ring.db", KEY_A)
    store = await opener.open(KEY_A, keyring=ring)
    ids = await fill(store)
    before = await sealed_under(opener, MESSAGE_VALUES + " UNION ALL " + MEMORY_VALUES)
    store = await opener.open([KEY_B, KEY_A], keyring=ring)
    report = await store.rotate_encryption_key()
    assert report.data_keys_rewrapped == 2  # session "s" and scope "global"
    # The payloads under data keys are not re-encrypted; only the store key's rows are.
    assert {t: n for t, n in report.rewritten.items() if n} == {"task_steps": 2, "approvals": 2}
    assert await sealed_under(opener, MESSAGE_VALUES + " UNION ALL " + MEMORY_VALUES) == before
    assert (await store.rotate_encryption_key()).data_keys_rewrapped == 0  # done
    store = await opener.open(KEY_B, keyring=ring)
    await check_all(store, ids)
    await opener.close()
    with pytest.raises(statekeel.KeyRingError, match=statekeel.key_id(KEY_B)) as info:
        await opener.open(KEY_A, keyring=ring)  # the old store key no longer unwraps the ring
    assert info.value.key_id == statekeel.key_id(KEY_B)


async def test_a_store_encrypted_before_its_key_ring_reads_as_before_and_rotation_moves_it_to_data_keys(
    opener: Opener, tmp_path: Path
) -> None:
    store = await opener.open(KEY_A)
    ids = await fill(store)
    ring = await statekeel.create_keyring(tmp_path / "ring.db", KEY_A)
    store = await opener.open(KEY_A, keyring=ring)
    await check_all(store, ids)  # values under the store key still open
    report = await store.rotate_encryption_key()
    assert report.rewritten["messages"] == 3 and report.rewritten["memories"] == 2
    assert report.rewritten["memory_events"] == 3 and report.rewritten["task_steps"] == 0
    assert statekeel.key_id(KEY_A) not in await sealed_under(
        opener, MESSAGE_VALUES + " UNION ALL " + MEMORY_VALUES
    )
    store = await opener.open(KEY_A, keyring=ring)
    await check_all(store, ids)


async def test_with_a_key_ring_a_fallback_file_is_sealed_under_its_sessions_data_key(tmp_path: Path) -> None:
    db, fb = tmp_path / "store.db", tmp_path / "fallback"
    ring = await statekeel.create_keyring(tmp_path / "ring.db", KEY_A)
    url = f"sqlite:///{db}"
    async with statekeel.open_store(
        url, fallback_dir=str(fb), busy_timeout_ms=50, encryption_key=KEY_A, keyring=ring
    ) as store:
        session = await store.sessions.get_or_create("s")
        session.add_message("user", "before")
        await store.sessions.save(session)
        (data_key,) = await sealed_under_file(db, "SELECT CAST(payload AS TEXT) FROM messages")
        with database_write_locked(db):
            session.add_message("assistant", f"{SECRET}-during")
            await store.sessions.save(session)  # the database is locked: the fallback file takes it
            (name,) = os.listdir(fb)
            lines = (fb / name).read_bytes().split(b"\n")[1:-1]
        assert SECRET.encode() not in b"".join(lines)
        assert stored_key_ids([line.decode() for line in lines]) == {data_key}
        assert data_key != statekeel.key_id(KEY_A)
        assert (await store.sessions.replay_fallback()).replayed == {"s": 1}
        assert [m.payload["content"] for m in await store.backend.read_messages("s")] == [
            "before",
            f"{SECRET}-during",
        ]


async def sealed_under_file(db: Path, sql: str) -> set[str]:
    conn = sqlite3.connect(db)
    try:
        return stored_key_ids([v for (v,) in conn.execute(sql).fetchall() if v is not None])
    finally:
        conn.close()


async def test_a_key_ring_that_is_missing_too_open_damaged_or_made_with_another_key_is_refused(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with pytest.raises(statekeel.KeyRingError, match=r"does not exist.*create_keyring"):
        await statekeel.open_store(url, encryption_key=KEY_A, keyring=tmp_path / "none.db")
    ring = await statekeel.create_keyring(tmp_path / "ring.db", KEY_A)
    os.chmod(ring, 0o644)
    with pytest.raises(statekeel.KeyRingError, match="chmod 600"):
        await statekeel.open_store(url, encryption_key=KEY_A, keyring=ring)
    os.chmod(ring, 0o600)
    with pytest.raises(statekeel.KeyRingError, match="made with store key id") as info:
        await statekeel.open_store(url, encryption_key=KEY_B, keyring=ring)
    assert info.value.key_id == statekeel.key_id(KEY_A) and info.value.path == ring
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(b"not a key ring at all" * 100)
    damaged.chmod(0o600)
    with pytest.raises(statekeel.KeyRingError, match=r"not a statekeel key ring|cannot be opened"):
        await statekeel.open_store(url, encryption_key=KEY_A, keyring=damaged)
    with pytest.raises(statekeel.InvalidArgument, match="keyring needs an encryption_key"):
        statekeel.open_store(url, keyring=ring)
    with pytest.raises(statekeel.InvalidArgument, match="keyring must be a path"):
        statekeel.open_store(url, encryption_key=KEY_A, keyring=3)  # type: ignore[arg-type]
    with pytest.raises(statekeel.InvalidArgument, match="never overwritten"):
        await statekeel.create_keyring(ring, KEY_A)
    assert not (tmp_path / "store.db").exists()  # nothing was written by any of the refused opens
    assert not (tmp_path / "none.db").exists()


async def test_a_key_ring_altered_outside_statekeel_fails_to_authenticate(tmp_path: Path) -> None:
    ring = await statekeel.create_keyring(tmp_path / "ring.db", KEY_A)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = await statekeel.open_store(url, encryption_key=KEY_A, keyring=ring)
    async with store.sessions.open("s") as session:
        session.add_message("user", "hello")
    await store.close()
    conn = sqlite3.connect(ring)
    conn.execute("UPDATE data_keys SET wrapped = zeroblob(60)")
    conn.commit()
    conn.close()
    async with statekeel.open_store(url, encryption_key=KEY_A, keyring=ring) as store:
        with pytest.raises(statekeel.KeyRingError, match="does not authenticate"):
            await store.backend.read_messages("s", start=0)


async def test_a_data_key_another_process_destroyed_opens_nothing_and_is_never_sealed_under_again(
    tmp_path: Path,
) -> None:
    ring = await statekeel.create_keyring(tmp_path / "ring.db", KEY_A)
    here, there = open_keyring(ring, KEY_A), open_keyring(ring, KEY_A)
    try:
        first, _ = here.sealing_key("s")
        assert here.opening_key(first) is not None  # unwrapped and remembered here
        there.mark("erasure-1", ["s"])
        assert there.destroy("erasure-1") == 1
        assert here.opening_key(first) is None and here.destroyed(first)
        second, _ = here.sealing_key("s")  # a session of that key started afterwards: a new key
        assert second != first and there.opening_key(second) is not None
    finally:
        here.close()
        there.close()


def ring_files(root: Path) -> tuple[bytes, set[int]]:
    """The bytes of the ring file and its log, and their modes."""
    paths = list(root.glob("ring.db*"))
    return b"".join(p.read_bytes() for p in paths), {stat.S_IMODE(p.stat().st_mode) for p in paths}


async def test_a_destroyed_data_key_is_gone_from_the_ring_file_and_its_log(tmp_path: Path) -> None:
    ring_path = await statekeel.create_keyring(tmp_path / "ring.db", KEY_A)
    ring = open_keyring(ring_path, KEY_A)
    try:
        for name in ("alice", "bob"):
            ring.sealing_key(name)
        conn = sqlite3.connect(ring_path)
        wrapped = dict(conn.execute("SELECT key_id, wrapped FROM data_keys").fetchall())
        conn.close()
        ring.mark("erasure-1", ["alice"])
        assert ring.destroy("erasure-1") == 1
        on_disk, modes = ring_files(tmp_path)
        kept = [kid for kid, blob in wrapped.items() if blob in on_disk]
        assert len(kept) == 1 and not ring.destroyed(kept[0])  # bob's stays; alice's is nowhere
        assert modes == {0o600}
    finally:
        ring.close()
