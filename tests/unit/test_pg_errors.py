"""PostgreSQL error translation: bad data is the caller's error, never "the server is unavailable".

PostgreSQL refuses some values the other backends accept (NUL in text, lone surrogates, integers out of
the column's range). Reported as ``BackendUnavailable`` they would send ``sessions.save`` to its fallback
file — a file whose replay can never succeed — and invite callers to retry bad input forever.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest

import statekeel
from statekeel.backends.postgres.backend import PgTarget, translate

pytestmark = pytest.mark.postgres


async def test_session_save_with_a_value_postgres_refuses_raises_invalid_argument_and_writes_no_fallback(
    pg_migrated: str, tmp_path: Path
) -> None:
    fallback = tmp_path / "fallback"
    async with statekeel.open_store(pg_migrated, fallback_dir=str(fallback)) as store:
        session = await store.sessions.get_or_create("s")
        session.add_message("user", "kept")
        await store.sessions.save(session)

        bad = await store.sessions.get_or_create("bad")
        bad.add_message("us\x00er", "hello")  # a role with NUL: PostgreSQL TEXT cannot hold it
        with pytest.raises(statekeel.InvalidArgument) as info:
            await store.sessions.save(bad)
        assert not isinstance(info.value, statekeel.BackendUnavailable)
        assert not fallback.exists() or not os.listdir(fallback), "bad input went to a fallback file"

        # The store stays usable and the earlier state is intact.
        session.add_message("assistant", "still works")
        await store.sessions.save(session)
        rows = await store.backend.read_messages("s")
        assert [r.payload["content"] for r in rows] == ["kept", "still works"]
        assert await store.backend.read_messages("bad") == []


async def test_text_postgres_cannot_store_raises_invalid_argument_with_sqlstate(pg_migrated: str) -> None:
    async with statekeel.open_store(pg_migrated) as store:
        now = dt.datetime.now(dt.UTC)
        row = ("s", "active", "{}", 0, 0, 1, now, now, 0, None, None, None, None, 0)
        await store.backend.import_rows("sessions", [row])
        for bad_key in ("a\x00b", "a\ud800b"):
            with pytest.raises(statekeel.InvalidArgument) as info:
                await store.backend.import_rows("sessions", [(bad_key, *row[1:])])
            assert getattr(info.value, "sqlstate", None), "the PostgreSQL error code is kept as a field"
        assert await store.backend.count_rows("sessions") == 1


async def test_integer_out_of_range_for_postgres_raises_invalid_argument(pg_migrated: str) -> None:
    async with statekeel.open_store(pg_migrated) as store:
        now = dt.datetime.now(dt.UTC)
        with pytest.raises(statekeel.InvalidArgument):
            await store.backend.import_rows(
                "sessions", [("s", "active", "{}", 0, 2**63, 1, now, now, 0, None, None)]
            )
        assert await store.backend.count_rows("sessions") == 0


def test_translate_keeps_connection_and_server_errors_as_backend_unavailable() -> None:
    import asyncpg

    target = PgTarget("postgresql://u:secret@db.example:5432/agents")
    assert isinstance(translate(asyncpg.AdminShutdownError("bye"), target), statekeel.BackendUnavailable)
    assert isinstance(translate(asyncpg.DiskFullError("full"), target), statekeel.BackendUnavailable)
    err = translate(asyncpg.CharacterNotInRepertoireError("0x00"), target)
    assert isinstance(err, statekeel.InvalidArgument)
    assert "secret" not in str(err)
