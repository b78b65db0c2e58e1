"""Tampering with the audit log directly in the database: the triggers refuse UPDATE and DELETE, and a
change made around them (trigger dropped or disabled) is named by ``verify()`` (SQLite, PostgreSQL)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

import statekeel
from helpers import RawDb
from statekeel.backends.sql import Tx, to_micros, utcnow
from statekeel.chain import GENESIS_HASH, approval_digest, chain_hash
from statekeel.codec import canonical


@contextlib.asynccontextmanager
async def chain_of_five(url: str) -> AsyncIterator[list[statekeel.AuditEntry]]:
    async with statekeel.open_store(url) as store:
        yield [await store.audit.append("tool.call", "agent", "task:1", {"n": i}) for i in range(1, 6)]


async def verify(url: str) -> statekeel.AuditVerification:
    async with statekeel.open_store(url) as store:
        return await store.audit.verify()


async def test_the_database_refuses_update_and_delete_of_audit_entries(shared_url: str) -> None:
    async with chain_of_five(shared_url) as entries:
        pass
    raw = RawDb(shared_url)
    assert "append-only" in await raw.refused("UPDATE audit_log SET data = '{\"n\":99}' WHERE seq = 3")
    assert "append-only" in await raw.refused("DELETE FROM audit_log WHERE seq = 2")
    async with statekeel.open_store(shared_url) as store:
        assert await store.audit.query() == entries
        assert await store.audit.verify() == statekeel.AuditVerification(ok=True, count=5)


async def test_changing_an_entrys_data_behind_the_triggers_makes_verify_name_its_seq(shared_url: str) -> None:
    async with chain_of_five(shared_url):
        pass
    await RawDb(shared_url).execute(
        "UPDATE audit_log SET data = '{\"n\":99}' WHERE seq = 3", unguarded="audit_log"
    )
    report = await verify(shared_url)
    assert (report.ok, report.first_bad_seq, report.count) == (False, 3, 2)
    assert report.reason is not None and "changed" in report.reason
    with pytest.raises(statekeel.AuditTampered) as info:
        report.raise_if_tampered()
    assert info.value.first_bad_seq == 3


async def test_deleting_an_entry_behind_the_triggers_makes_verify_name_its_seq(shared_url: str) -> None:
    async with chain_of_five(shared_url):
        pass
    await RawDb(shared_url).execute("DELETE FROM audit_log WHERE seq = 2", unguarded="audit_log")
    report = await verify(shared_url)
    assert (report.ok, report.first_bad_seq) == (False, 2)
    assert report.reason is not None and "missing" in report.reason


async def test_rewriting_an_entry_with_a_fresh_hash_breaks_the_link_to_the_next(shared_url: str) -> None:
    async with chain_of_five(shared_url) as entries:
        pass
    third = entries[2]
    forged: dict[str, Any] = {
        "seq": 3,
        "kind": third.kind,
        "actor": third.actor,
        "subject": third.subject,
        "data": '{"n":99}',
        "created_at": to_micros(third.created_at),
        "prev_hash": third.prev_hash,
    }
    digest = hashlib.sha256(statekeel.codec.canonical(forged)).hexdigest()
    await RawDb(shared_url).execute(
        f"UPDATE audit_log SET data = '{{\"n\":99}}', hash = '{digest}' WHERE seq = 3", unguarded="audit_log"
    )
    report = await verify(shared_url)
    assert (report.ok, report.first_bad_seq) == (False, 4)


# With an audit key (open_store(audit_key=...)) every entry carries an HMAC of its hash: what the chain
# alone cannot show — a consistent rewrite by someone who can write the database — is found too.

KEY = b"k" * 32


async def rewrite_chain(url: str, entries: list[statekeel.AuditEntry], seq: int, data: str) -> None:
    """Change entry ``seq``'s data and recompute every hash from it on, as an attacker without the key
    can: the chain is consistent again (MACs, which need the key, are left as they were)."""
    prev_hash = entries[seq - 2].hash if seq > 1 else GENESIS_HASH
    raw = RawDb(url)
    for entry in entries[seq - 1 :]:
        text = data if entry.seq == seq else statekeel.codec.canonical(entry.data).decode()
        digest = chain_hash(
            entry.seq, entry.kind, entry.actor, entry.subject, text, entry.created_at, prev_hash
        )
        await raw.execute(
            f"UPDATE audit_log SET data = ?, prev_hash = '{prev_hash}', hash = '{digest}' "
            f"WHERE seq = {entry.seq}",
            text,
            unguarded="audit_log",
        )
        prev_hash = digest


async def keyed_chain(url: str) -> list[statekeel.AuditEntry]:
    async with statekeel.open_store(url, audit_key=KEY) as store:
        return [await store.audit.append("tool.call", "agent", "task:1", {"n": i}) for i in range(1, 6)]


async def verify_with(url: str, key: bytes | None) -> statekeel.AuditVerification:
    async with statekeel.open_store(url, audit_key=key) as store:
        return await store.audit.verify()


async def test_a_consistent_rewrite_passes_without_a_key_and_is_found_with_one(shared_url: str) -> None:
    entries = await keyed_chain(shared_url)
    assert all(e.mac is not None for e in entries)
    assert (await verify_with(shared_url, KEY)).authenticated == 5
    await rewrite_chain(shared_url, entries, 3, '{"n":99}')
    # The chain alone proves nothing against someone who can write the database...
    assert (await verify_with(shared_url, None)).ok
    # ...its MACs do: entry 3's no longer matches its hash.
    report = await verify_with(shared_url, KEY)
    assert (report.ok, report.first_bad_seq) == (False, 3)
    assert report.reason is not None and "MAC" in report.reason


async def test_removing_the_macs_is_found_with_the_key(shared_url: str) -> None:
    await keyed_chain(shared_url)
    raw = RawDb(shared_url)
    await raw.execute("UPDATE audit_log SET mac = NULL WHERE seq >= 4", unguarded="audit_log")
    report = await verify_with(shared_url, KEY)
    assert (report.ok, report.first_bad_seq) == (False, 4)
    await raw.execute("UPDATE audit_log SET mac = NULL", unguarded="audit_log")
    report = await verify_with(shared_url, KEY)
    assert not report.ok and report.reason is not None and "no entry carries a MAC" in report.reason


async def test_another_key_does_not_verify(shared_url: str) -> None:
    await keyed_chain(shared_url)
    report = await verify_with(shared_url, b"x" * 32)
    assert (report.ok, report.first_bad_seq) == (False, 1)


async def append_without_a_mac(store: statekeel.Store, kind: str, actor: str, subject: str, data: Any) -> int:
    """Append a consistent chain entry without a MAC, as someone who can write the database can (their
    own SQL, an older statekeel): statekeel itself refuses to, once the chain is keyed."""

    async def insert(tx: Tx) -> int:
        head = await tx.fetchone("audit_lock_head")
        assert head is not None
        seq, prev = head["seq"] + 1, head["hash"]
        created, text = utcnow(), canonical(data).decode()
        digest = chain_hash(seq, kind, actor, subject, text, created, prev)
        await tx.execute(
            "audit_insert", seq, kind, actor, subject, text, tx.ts_in(created), prev, digest, None
        )
        return int(seq)

    return await store.backend._write(insert)  # type: ignore[attr-defined,no-any-return]


async def test_an_entry_appended_without_the_key_after_keyed_ones_is_found(shared_url: str) -> None:
    await keyed_chain(shared_url)
    async with statekeel.open_store(shared_url) as keyless:
        with pytest.raises(statekeel.AuditKeyRequired):  # statekeel keeps a keyed chain keyed
            await keyless.audit.append("tool.call", "intruder", "task:1", {"n": 6})
        assert await append_without_a_mac(keyless, "tool.call", "intruder", "task:1", {"n": 6}) == 6
    report = await verify_with(shared_url, KEY)
    assert (report.ok, report.first_bad_seq) == (False, 6)


async def test_the_first_keyed_entry_vouches_for_the_entries_written_before_the_key(shared_url: str) -> None:
    async with chain_of_five(shared_url):
        pass
    report = await verify_with(shared_url, KEY)
    assert not report.ok and report.reason is not None and "append an entry under the key" in report.reason
    async with statekeel.open_store(shared_url, audit_key=KEY) as store:
        await store.audit.append("audit.key_added", "operator", "store", None)
        report = await store.audit.verify()
    assert report.ok and report.count == 6 and report.authenticated == 1


async def test_a_forged_approval_with_a_consistent_forged_entry_is_refused_under_a_key(
    shared_url: str,
) -> None:
    async with statekeel.open_store(shared_url, audit_key=KEY) as store:
        pending = await store.approvals.request("task:1", "deploy", {"env": "prod"}, "agent")
        head = (await store.audit.query(limit=10))[-1]
    raw = RawDb(shared_url)
    await raw.execute(
        "UPDATE approvals SET status = 'granted', decided_by = 'mallory', decided_at = requested_at "
        f"WHERE id = '{pending.id}'",
        unguarded="approvals",
    )
    async with statekeel.open_store(shared_url) as store:
        forged = await store.approvals.get(pending.id)
        assert forged is not None
        data = statekeel.codec.canonical(
            {
                "approval_id": forged.id,
                "action": forged.action,
                "args_hash": forged.args_hash,
                "row_hash": approval_digest(forged),
                "reason": None,
            }
        ).decode()
        # Appended like statekeel would, but without the key: a consistent chain entry with no MAC
        # (with its own SQL: statekeel refuses approval.* kinds from audit.append, and any entry without
        # a MAC on a keyed chain).
        await append_without_a_mac(
            store, "approval.granted", "mallory", forged.subject, statekeel.codec.decode(data.encode())
        )
        # Without a key nothing can tell this entry from a real one: the approval is honoured.
        assert await store.approvals.check("task:1", "deploy", {"env": "prod"}) == forged
    async with statekeel.open_store(shared_url, audit_key=KEY) as store:
        with pytest.raises(statekeel.AuditTampered) as info:
            await store.approvals.check("task:1", "deploy", {"env": "prod"})
        assert "MAC" in str(info.value)
        report = await store.audit.verify()
        assert (report.ok, report.first_bad_seq) == (False, head.seq + 1)


def test_an_audit_key_must_be_bytes_of_at_least_16() -> None:
    for bad in (b"short", "a string key of enough length", bytearray(32), 123):
        with pytest.raises(statekeel.InvalidArgument):
            statekeel.open_store("memory://", audit_key=bad)  # type: ignore[arg-type]
