"""One fault layer per engine, at the boundary between statekeel and its database driver (never inside
statekeel's own managers), for the model test and any contract test.

``lose_reply(engine, landed=True)`` is a context manager: inside it, the next write that reaches the
database loses its answer. With ``landed=True`` the write is applied first (the server committed, the
client never heard); with ``landed=False`` the connection dies before the write is sent (nothing applied).

- PostgreSQL (asyncpg): the next ``COMMIT`` of a transaction that is not read only, or the next
  writing statement outside one (a session save on PostgreSQL is one self-committing statement); the
  connection is then terminated and ``ConnectionDoesNotExistError`` raised, as a dropped TCP connection
  does.
- MariaDB (asyncmy): the next ``COMMIT`` of a transaction that is not read only; the connection is
  closed and error 2013 ("Lost connection") raised.
- NATS (nats-py): the next ``count`` JetStream publishes (a publish is retried with its message id, so a
  reply lost for good is lost on every attempt); each raises ``nats.errors.TimeoutError``.
- SQLite and memory:// have no reply to lose (the commit is a call in this process): ``applies`` is
  false for them. Their unavailable backend is SQLite's write lock held by another connection
  (``helpers.database_write_locked``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

LOSES_REPLIES = frozenset({"postgres", "mariadb", "nats", "nats+sqlite"})


def applies(engine: str) -> bool:
    """Whether ``engine`` has a reply that can be lost."""
    return engine in LOSES_REPLIES


class LostReply:
    """What the layer did: ``fired`` once a reply was lost."""

    def __init__(self, landed: bool, count: int) -> None:
        self.landed, self.left, self.fired = landed, count, 0

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        self.fired += 1
        return True


@contextlib.contextmanager
def _patched(owner: Any, name: str, replacement: Any) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _writes(args: tuple[Any, ...]) -> bool:
    """Whether a statement run outside a transaction may write (not a read, nor the BEGIN of one)."""
    query = args[0] if args and isinstance(args[0], str) else ""
    first = query.lstrip().split(None, 1)[0].upper() if query.strip() else ""
    return first not in ("BEGIN", "START", "SELECT", "SET", "SHOW", "RESET")


@contextlib.contextmanager
def _postgres(fault: LostReply) -> Iterator[None]:
    import asyncpg
    import asyncpg.connection
    import asyncpg.transaction

    commit = asyncpg.transaction.Transaction.commit

    def lost(conn: Any) -> BaseException:
        conn.terminate()
        return asyncpg.ConnectionDoesNotExistError("fault layer: the connection died before the answer")

    async def faulty_commit(self: Any) -> None:
        # A read's transaction (read only) has no write to lose: the fault waits for the next write.
        if self._readonly or not (self._connection is not None and fault.take()):
            return await commit(self)
        if fault.landed:
            await commit(self)
        raise lost(self._connection)

    def statement(name: str) -> Any:
        original = getattr(asyncpg.connection.Connection, name)

        async def faulty(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self.is_in_transaction() or not _writes(args) or not fault.take():
                return await original(self, *args, **kwargs)
            if fault.landed:
                await original(self, *args, **kwargs)
            raise lost(self)

        return faulty

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(asyncpg.transaction.Transaction, "commit", faulty_commit))
        for name in ("execute", "fetch", "fetchrow", "fetchval"):
            stack.enter_context(_patched(asyncpg.connection.Connection, name, statement(name)))
        yield


@contextlib.contextmanager
def _mariadb(fault: LostReply) -> Iterator[None]:
    import asyncmy.connection
    import asyncmy.errors

    commit = asyncmy.connection.Connection.commit
    query = asyncmy.connection.Connection.query
    reading: set[int] = set()  # the connections whose open transaction is read only

    async def noting_query(self: Any, sql: Any, *args: Any, **kwargs: Any) -> Any:
        text = sql.decode(errors="replace") if isinstance(sql, bytes) else str(sql)
        if "START TRANSACTION" in text:
            if "READ ONLY" in text:
                reading.add(id(self))
            else:
                reading.discard(id(self))
        return await query(self, sql, *args, **kwargs)

    async def faulty_commit(self: Any) -> None:
        # A read's transaction has no write to lose: the fault waits for the next write.
        if id(self) in reading or not fault.take():
            return await commit(self)
        if fault.landed:
            await commit(self)
        self.close()
        raise asyncmy.errors.OperationalError(2013, "fault layer: Lost connection to server during query")

    with (
        _patched(asyncmy.connection.Connection, "query", noting_query),
        _patched(asyncmy.connection.Connection, "commit", faulty_commit),
    ):
        yield


@contextlib.contextmanager
def _nats(fault: LostReply) -> Iterator[None]:
    import nats.errors
    import nats.js.client

    publish = nats.js.client.JetStreamContext.publish

    async def faulty_publish(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not fault.take():
            return await publish(self, *args, **kwargs)
        if fault.landed:
            await publish(self, *args, **kwargs)
        raise nats.errors.TimeoutError

    with _patched(nats.js.client.JetStreamContext, "publish", faulty_publish):
        yield


@contextlib.contextmanager
def lose_reply(engine: str, *, landed: bool, count: int | None = None) -> Iterator[LostReply]:
    """Lose the answer to the next write on ``engine`` (see the module docstring)."""
    if not applies(engine):
        raise ValueError(f"{engine} has no reply to lose")
    nats_engine = engine.startswith("nats")
    fault = LostReply(landed, count if count is not None else (3 if nats_engine else 1))
    layer = _nats if nats_engine else _postgres if engine == "postgres" else _mariadb
    with layer(fault):
        yield fault
