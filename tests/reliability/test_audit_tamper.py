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
from statekeel.backends.sql import to_micros


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
