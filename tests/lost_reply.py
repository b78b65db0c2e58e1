"""A lost reply at each engine's connection boundary: the write lands, and its caller never hears of it.

:func:`lose_the_next_reply` arms one store so that the next session write goes through to the engine and
commits, and then every answer to it is lost, including the answers to the backend's own retries of it:

- PostgreSQL: the save's one statement commits, then the connection dies (``ConnectionResetError``) on it
  and on its re-run;
- MariaDB: the transaction's COMMIT commits, then the connection dies;
- NATS (plain and paired): the event is stored, then its publish ack never arrives (a timeout), nor the
  acks of the client's re-publishes with the same ``Nats-Msg-Id``;
- SQLite and ``memory://``: an embedded engine has no network reply to lose; the write job commits and
  the call then fails as a lost reply does (``BackendUnavailable(outcome="unknown")``), which is what the
  settling protocol above it has to handle.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

import statekeel
from statekeel.backends.composite import CompositeBackend


class LostReply:
    """What the armed hook saw: whether the write landed, and how many answers it swallowed."""

    def __init__(self) -> None:
        self.landed = False
        self.swallowed = 0


def sessions_engine(store: statekeel.Store) -> Any:
    """The backend that holds the store's sessions (the NATS side of a paired store)."""
    backend: Any = store.backend
    if isinstance(backend, CompositeBackend):
        return backend.front if "sessions" in backend.front_kinds else backend.rest
    return backend


@contextlib.contextmanager
def lose_the_next_reply(store: statekeel.Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[LostReply]:
    """Within the block, the next session write lands and every answer to it is lost (see the module)."""
    engine = sessions_engine(store)
    lost = LostReply()
    name = type(engine).__name__
    with monkeypatch.context() as patch:
        if name == "PostgresBackend":
            _on_postgres(patch, lost)
        elif name == "MySqlBackend":
            _on_mariadb(patch, engine, lost)
        elif name == "NatsBackend":
            _on_nats(patch, engine, lost)
        elif name == "SqliteBackend":
            _on_sqlite(patch, engine, lost)
        else:
            raise AssertionError(f"no lost-reply hook for {name}")
        yield lost


def _on_postgres(patch: pytest.MonkeyPatch, lost: LostReply) -> None:
    from statekeel.backends.postgres import backend as pg

    statement = pg.op_save_in_one_statement

    async def then_lost(*args: Any) -> Any:
        if not lost.landed:
            await statement(*args)
            lost.landed = True
        lost.swallowed += 1
        raise ConnectionResetError("the answer to the statement was lost")

    patch.setattr(pg, "op_save_in_one_statement", then_lost)


class _CommitThenLost:
    """An asyncmy connection whose next COMMIT commits and then loses its answer."""

    def __init__(self, conn: Any, lost: LostReply) -> None:
        self._conn, self._lost = conn, lost

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def commit(self) -> None:
        await self._conn.commit()
        if not self._lost.landed:
            self._lost.landed = True
            self._lost.swallowed += 1
            raise ConnectionResetError("the answer to COMMIT was lost")


def _on_mariadb(patch: pytest.MonkeyPatch, engine: Any, lost: LostReply) -> None:
    pool = engine._require_pool()
    acquire, release = pool.acquire, pool.release

    async def acquired() -> Any:
        return _CommitThenLost(await acquire(), lost)

    def released(conn: Any) -> Any:
        return release(conn._conn if isinstance(conn, _CommitThenLost) else conn)

    patch.setattr(pool, "acquire", acquired)
    patch.setattr(pool, "release", released)


def _on_nats(patch: pytest.MonkeyPatch, engine: Any, lost: LostReply) -> None:
    import nats.errors

    js = engine.conn.js
    publish = js.publish

    async def stored_then_no_ack(*args: Any, **kwargs: Any) -> Any:
        if not lost.landed:
            await publish(*args, **kwargs)
            lost.landed = True
        lost.swallowed += 1
        raise nats.errors.TimeoutError

    patch.setattr(js, "publish", stored_then_no_ack)


def _on_sqlite(patch: pytest.MonkeyPatch, engine: Any, lost: LostReply, landed: bool = True) -> None:
    write = engine._write

    async def committed_then_lost(op: Any, *args: Any) -> Any:
        if lost.swallowed:
            return await write(op, *args)
        if landed:
            await write(op, *args)
            lost.landed = True
        lost.swallowed += 1
        raise statekeel.BackendUnavailable(
            "the reply to a committed write was lost (injected)", outcome="unknown", hint=""
        )

    patch.setattr(engine, "_write", committed_then_lost)


@contextlib.contextmanager
def lose_the_next_write_reply(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch, *, landed: bool = True
) -> Iterator[LostReply]:
    """Within the block, the next write of a SQL engine commits (with ``landed=False``: is never made)
    and its caller then hears ``BackendUnavailable(outcome="unknown")``, as from a COMMIT whose answer
    was lost (a task's or a step's record: the backends raise that for a lost COMMIT, see
    ``test_connection_faults.py``)."""
    engine: Any = store.backend
    if isinstance(engine, CompositeBackend):
        engine = engine.rest
    lost = LostReply()
    with monkeypatch.context() as patch:
        _on_sqlite(patch, engine, lost, landed)  # the engine's write wrapper, whichever SQL dialect
        yield lost
