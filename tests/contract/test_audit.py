"""The audit log: chained appends, queries, verification and the append-only guard, on every backend."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
from typing import Any

import pytest

import statekeel
from statekeel.audit import GENESIS_HASH, chain_hash
from statekeel.backends.sql import Tx
from statekeel.codec import canonical

Store = statekeel.Store
pytestmark = pytest.mark.kinds("audit")


async def test_appends_form_a_dense_hash_chain(store: Store) -> None:
    first = await store.audit.append("tool.call", "agent-7", "task:1", {"tool": "rm", "args": ["a.txt"]})
    second = await store.audit.append("tool.result", "agent-7", "task:1", {"ok": True})
    assert (first.seq, second.seq) == (1, 2)
    assert first.prev_hash == GENESIS_HASH and second.prev_hash == first.hash
    assert first.data == {"tool": "rm", "args": ["a.txt"]}
    assert first.hash == chain_hash(
        1, "tool.call", "agent-7", "task:1", '{"args":["a.txt"],"tool":"rm"}', first.created_at, GENESIS_HASH
    )
    assert await store.audit.verify() == statekeel.AuditVerification(ok=True, count=2)


async def test_an_empty_log_verifies(store: Store) -> None:
    assert await store.audit.verify() == statekeel.AuditVerification(ok=True, count=0)


async def test_concurrent_appends_never_fork_the_chain(store: Store) -> None:
    entries = await asyncio.gather(*(store.audit.append("k", f"a{i}", "s", {"i": i}) for i in range(40)))
    assert sorted(e.seq for e in entries) == list(range(1, 41))
    assert len({e.prev_hash for e in entries}) == 40
    report = await store.audit.verify()
    assert report.ok and report.count == 40


async def test_concurrent_appends_of_two_stores_on_one_database_never_fork_the_chain(
    store: Store, store_url: str
) -> None:
    # Two processes: each store serialises its own appends, so only the database's (the stream's)
    # conditional write keeps two appends after the same head apart.
    if store_url == "memory://":
        pytest.skip("an in-memory store cannot be opened twice")
    async with statekeel.open_store(store_url) as other:
        entries = await asyncio.gather(
            *(s.audit.append("k", f"a{i}", "s", {"i": i}) for i in range(20) for s in (store, other))
        )
        assert sorted(e.seq for e in entries) == list(range(1, 41))
        assert len({e.prev_hash for e in entries}) == 40
        for s in (store, other):
            report = await s.audit.verify()
            assert report.ok and report.count == 40, report


async def test_query_filters_by_subject_kind_and_time(store: Store) -> None:
    await store.audit.append("login", "alice", "user:alice", {"ip": "10.0.0.1"})
    mark = dt.datetime.now(dt.UTC)
    await store.audit.append("tool.call", "agent", "task:1", {"n": 1})
    await store.audit.append("tool.call", "agent", "task:2", {"n": 2})
    assert [e.seq for e in await store.audit.query(subject="task:1")] == [2]
    assert [e.seq for e in await store.audit.query(kind="tool.call")] == [2, 3]
    assert [e.seq for e in await store.audit.query(since=mark)] == [2, 3]
    assert [e.seq for e in await store.audit.query(limit=2)] == [1, 2]
    assert [e.seq for e in await store.audit.query(limit=2, after_seq=2)] == [3]


async def test_bad_entries_raise_typed_errors_and_append_nothing(store: Store) -> None:
    for args in (("", "a", "s"), ("k", "", "s"), ("k", "a", ""), ("k", None, "s")):
        with pytest.raises(statekeel.InvalidArgument):
            await store.audit.append(*args, {})  # type: ignore[arg-type]
    with pytest.raises(statekeel.SerializationError, match=r"data\.f"):
        await store.audit.append("k", "a", "s", {"f": lambda: 1})
    with pytest.raises(statekeel.InvalidArgument):
        await store.audit.query(since=dt.datetime(2020, 1, 1))
    assert await store.audit.query() == []
    assert (await store.audit.append("k", "a", "s")).seq == 1


def _dialect_queries(store: Store) -> dict[str, Any]:
    if store.backend.__class__.__name__ == "MySqlBackend":
        from statekeel.backends.mysql.queries import compile_query

        class Compiling(dict[str, Any]):
            def __setitem__(self, name: str, sql: Any) -> None:
                store.backend._scripts[name] = compile_query(name, sql)  # type: ignore[attr-defined]

        return Compiling()
    if store.backend.__class__.__name__ == "PostgresBackend":
        from statekeel.backends.postgres import backend as pg

        return pg.queries()
    from statekeel.backends.sqlite import backend as lite

    return lite.queries()


@pytest.mark.kinds("audit", "transactions")  # through the SQL backends' own writer
@pytest.mark.parametrize(
    ("name", "sql"),
    [
        ("test_audit_update", "UPDATE audit_log SET data = '{\"forged\":true}' WHERE seq = 1"),
        ("test_audit_delete", "DELETE FROM audit_log WHERE seq = 1"),
    ],
)
async def test_updating_or_deleting_an_entry_through_the_backend_is_refused(
    store: Store, monkeypatch: pytest.MonkeyPatch, name: str, sql: str
) -> None:
    entry = await store.audit.append("k", "a", "s", {"v": 1})
    # A query that statekeel does not ship, run the way every statekeel write runs.
    monkeypatch.setitem(_dialect_queries(store), name, sql)

    async def op(tx: Tx) -> Any:
        return await tx.execute(name)

    with pytest.raises(statekeel.ConflictError, match="append-only"):
        await store.backend._write(op)  # type: ignore[attr-defined]
    assert await store.audit.query() == [entry]
    assert (await store.audit.verify()).ok


@pytest.mark.parametrize("subject", ["task:42", "nul\x00inside"])
def test_an_entry_hash_is_the_sha256_of_the_canonical_encoding_of_its_fields(subject: str) -> None:
    at = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
    fields = {
        "seq": 7,
        "kind": "task.transitioned",
        "actor": "worker-1",
        "subject": subject,
        "data": '{"to":"running"}',
        "created_at": 1767323045678901,
        "prev_hash": "a" * 64,
    }
    expected = hashlib.sha256(canonical(fields)).hexdigest()
    assert (
        chain_hash(7, "task.transitioned", "worker-1", subject, '{"to":"running"}', at, "a" * 64) == expected
    )


AUDIT_KEY = b"k" * 32


async def test_a_keyed_chain_refuses_an_audited_write_without_the_key(shared_url: str) -> None:
    """A store opened without the audit key cannot append an entry without a MAC after a keyed one (the
    chain would stop verifying under the key for good): the write is refused with AuditKeyRequired and
    nothing is written — neither the entry nor the change it audits."""
    async with statekeel.open_store(shared_url, audit_key=AUDIT_KEY) as keyed:
        queued = await keyed.tasks.create("deploy", status="queued")
        approval = await keyed.approvals.request("task:1", "deploy", {"env": "prod"}, "agent")
        before = await keyed.audit.verify()
        assert before.ok and before.authenticated == before.count > 0
    async with statekeel.open_store(shared_url) as plain:
        writes = {
            "audit.append": lambda: plain.audit.append("note", "ops", "s", {"x": 1}),
            "tasks.create": lambda: plain.tasks.create("another"),
            "tasks.claim": lambda: plain.tasks.claim("w1"),
            "tasks.transition": lambda: plain.tasks.transition(queued.id, "cancelled"),
            "approvals.request": lambda: plain.approvals.request("s", "a", {}, "agent"),
            "approvals.decide": lambda: plain.approvals.decide(approval.id, True, "ann"),
        }
        for name, write in writes.items():
            with pytest.raises(statekeel.AuditKeyRequired) as info:
                await write()
            assert "audit key" in str(info.value), name
            assert info.value.head_seq == before.count  # type: ignore[attr-defined]
        # Nothing was written: the same entries, the task and the approval as they were.
        assert [t.id for t in (await plain.tasks.list(limit=10)).items] == [queued.id]
        assert await plain.tasks.get(queued.id) == queued
        assert [a.id for a in await plain.approvals.pending()] == [approval.id]
        assert (await plain.audit.verify()).count == before.count
        # Writes without an audit entry go on as before.
        session = await plain.sessions.get_or_create("chat")
        session.add_message("user", "hi")
        await plain.sessions.save(session)
    async with statekeel.open_store(shared_url, audit_key=AUDIT_KEY) as keyed:
        after = await keyed.audit.verify()
        assert after.ok and after.count == before.count and after.authenticated == after.count
        await keyed.tasks.transition(queued.id, "cancelled")  # with the key, the chain goes on
        assert (await keyed.audit.verify()).ok


async def test_an_unkeyed_chain_takes_writes_without_a_key_and_a_key_added_later(shared_url: str) -> None:
    async with statekeel.open_store(shared_url) as plain:
        await plain.audit.append("note", "ops", "s", {"n": 1})
    async with statekeel.open_store(shared_url, audit_key=AUDIT_KEY) as keyed:
        await keyed.audit.append("note", "ops", "s", {"n": 2})  # the first keyed entry vouches for the first
        report = await keyed.audit.verify()
        assert report.ok and report.count == 2
    async with statekeel.open_store(shared_url) as plain:
        with pytest.raises(statekeel.AuditKeyRequired):
            await plain.audit.append("note", "ops", "s", {"n": 3})


def _in_another_process_meanwhile(url: str, change: Any) -> None:
    """Run ``change(store)`` to completion on a store of its own (own event loop, own connections), as
    another process would, while the caller's thread waits."""
    import threading

    failures: list[BaseException] = []

    async def run() -> None:
        async with statekeel.open_store(url) as other:
            await change(other)

    def main() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    thread = threading.Thread(target=main)
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and not failures, failures


async def _request(store: Store) -> None:
    await store.approvals.request("task:2", "deploy", {"env": "dev"}, "agent")


async def _decide(store: Store) -> None:
    (pending,) = await store.approvals.pending()
    await store.approvals.decide(pending.id, True, "alice")


async def _consume(store: Store) -> None:
    found = await store.approvals.check("task:1", "deploy", {"env": "prod"})
    assert found is not None
    await store.approvals.consume(found.id, "agent")


@pytest.mark.parametrize("change", [_request, _decide, _consume], ids=["requested", "decided", "consumed"])
async def test_an_approval_changed_while_verify_reads_is_never_reported_as_tampering(
    shared_url: str, monkeypatch: pytest.MonkeyPatch, change: Any
) -> None:
    """verify() reads the chain and the approvals on one snapshot: an approval requested, decided or
    consumed by another process after the chain was read (and before the approvals are) is seen with
    its entry, or not at all."""
    if shared_url.startswith("sqlite"):
        from statekeel.backends.sqlite.backend import SqliteTx as DialectTx
    elif shared_url.startswith("mariadb"):
        from statekeel.backends.mysql.tx import MyTx as DialectTx  # type: ignore[assignment]
    else:
        from statekeel.backends.postgres.backend import PgTx as DialectTx  # type: ignore[assignment]

    async with statekeel.open_store(shared_url) as store:
        approval = await store.approvals.request("task:1", "deploy", {"env": "prod"}, "agent")
        if change is not _decide:
            await store.approvals.decide(approval.id, True, "alice")
        before = await store.audit.verify()
        assert before.ok
        fetchall = DialectTx.fetchall
        fired: list[str] = []

        async def chain_read_then_change(self: Any, name: str, *args: Any) -> Any:
            rows = await fetchall(self, name, *args)
            if name == "audit_read" and not fired:  # the whole chain read (one page): change it now
                fired.append(name)
                _in_another_process_meanwhile(shared_url, change)
            return rows

        monkeypatch.setattr(DialectTx, "fetchall", chain_read_then_change)
        during = await store.audit.verify()
        monkeypatch.undo()
        assert fired
        assert during.ok, during.reason
        assert (during.count, during.approvals) == (before.count, before.approvals)
        after = await store.audit.verify()
        assert after.ok and after.count == before.count + 1, after.reason
