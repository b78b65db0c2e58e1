"""Error texts: each names what happened and what to do, once, and never claims something that is not so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import statekeel
from helpers import database_write_locked, sqlite_url
from statekeel import errors

HINTED = [
    cls
    for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, errors.StatekeelError) and cls.hint
]


@pytest.mark.parametrize("cls", HINTED, ids=lambda c: c.__name__)
def test_a_hint_is_added_once(cls: type[errors.StatekeelError]) -> None:
    plain = cls("something happened")
    assert str(plain) == f"something happened. {cls.hint}"
    said = cls(f"something happened; {cls.hint.lower()}")
    assert str(said).lower().count(cls.hint.lower()) == 1


def test_a_raise_site_can_give_its_own_advice_instead_of_the_class_hint() -> None:
    exc = statekeel.ConflictError("the destination is not empty; pass overwrite=True", hint="", table="t")
    assert str(exc) == "the destination is not empty; pass overwrite=True"
    assert exc.table == "t"  # type: ignore[attr-defined]
    assert exc.hint == "" and statekeel.ConflictError.hint  # the class keeps its hint


async def test_a_file_that_is_not_sqlite_is_refused_saying_once_that_it_was_not_modified(
    tmp_path: Path,
) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database\n" * 100)
    with pytest.raises(statekeel.StorageCorrupt) as info:
        await statekeel.open_store(sqlite_url(path))
    text = str(info.value).lower()
    assert text.count("not modified") == 1
    assert "backup" in text  # what to do


async def test_a_save_that_reached_neither_the_database_nor_a_fallback_file_claims_nothing_is_safe(
    tmp_path: Path,
) -> None:
    db = tmp_path / "agent.db"
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    async with statekeel.open_store(
        sqlite_url(db), fallback_dir=os.fspath(blocker / "fallback"), busy_timeout_ms=50
    ) as store:
        session = await store.sessions.get_or_create("s")
        session.add_message("user", "nowhere to go")
        with database_write_locked(db), pytest.raises(statekeel.BackendUnavailable) as info:
            await store.sessions.save(session)
    text = str(info.value)
    assert "safe" not in text
    assert "not saved" in text


async def test_copy_store_errors_do_not_blame_another_writer(tmp_path: Path) -> None:
    src, dst = sqlite_url(tmp_path / "src.db"), sqlite_url(tmp_path / "dst.db")
    async with statekeel.open_store(dst) as store:
        await store.tasks.create("already here")
    async with statekeel.open_store(src) as store:
        await store.tasks.create("to copy")
    with pytest.raises(statekeel.ConflictError) as info:
        await statekeel.copy_store(src, dst)
    text = str(info.value)
    assert "another writer" not in text.lower()
    assert text.count("overwrite=True") == 1


async def test_a_failed_migration_says_once_that_the_database_is_as_it_was(tmp_path: Path) -> None:
    from statekeel.backends.sql.migrations import Migration
    from statekeel.backends.sqlite.backend import SqliteBackend, migrations_shipped
    from statekeel.codec import Codec

    path = tmp_path / "m.db"
    async with statekeel.open_store(sqlite_url(path)):
        pass
    shipped = migrations_shipped()
    broken = [*shipped, Migration(len(shipped) + 1, "broken", "CREATE TABLE sessions (x INTEGER);")]
    backend = SqliteBackend(sqlite_url(path), str(path), codec=Codec(), migrations=broken)
    with pytest.raises(statekeel.MigrationError) as info:
        await backend.initialize()
    text = str(info.value)
    assert text.count("as it was") == 1
    assert "broken" in text


@pytest.mark.postgres
async def test_a_value_postgres_refuses_says_once_that_nothing_was_written(pg_migrated: str) -> None:
    async with statekeel.open_store(pg_migrated) as store:
        with pytest.raises(statekeel.InvalidArgument) as info:
            await store.backend.append_messages("s", 0, [], create=True, metadata=b'{"k": "\\u0000"}')
    assert str(info.value).lower().count("nothing was written") == 1


@pytest.mark.kinds("approvals")
async def test_an_approval_decided_or_used_already_is_refused_without_advice_to_retry(
    store: statekeel.Store,
) -> None:
    approval = await store.approvals.request("repo", "deploy", {"env": "prod"}, requested_by="agent")
    await store.approvals.decide(approval.id, True, "ada")
    with pytest.raises(statekeel.ConflictError) as decided:
        await store.approvals.decide(approval.id, False, "bob")
    await store.approvals.consume(approval.id, "run-1")
    with pytest.raises(statekeel.ConflictError) as used:
        await store.approvals.consume(approval.id, "run-2")
    for caught, what in ((decided, "already granted by 'ada'"), (used, "already consumed by 'run-1'")):
        text = str(caught.value)
        assert what in text
        assert "retry" not in text and "re-apply" not in text
        assert "request a new" in text
