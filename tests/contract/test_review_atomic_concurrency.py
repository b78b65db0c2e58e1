"""Operations started concurrently inside one ``atomic()`` block (child tasks inherit the block) join it.

On SQLite they queue on the block's transaction; on PostgreSQL they shared one asyncpg connection at the
same time, which asyncpg refuses ("another operation is in progress") — reported as the server being
unreachable, the block's connection thrown away and everything in it rolled back.
"""

from __future__ import annotations

import asyncio

import pytest

import statekeel
from statekeel.backends.base import NewMessage


def _msg(store: statekeel.Store, text: str) -> NewMessage:
    return NewMessage("user", store.codec.encode({"role": "user", "content": text}))


async def test_concurrent_operations_inside_one_atomic_block_all_commit_together(
    store: statekeel.Store,
) -> None:
    b = store.backend
    async with b.atomic():
        await asyncio.gather(
            *(b.append_messages(f"s{i}", 0, [_msg(store, f"m{i}")], create=True) for i in range(8))
        )
    for i in range(8):
        assert [r.payload["content"] for r in await b.read_messages(f"s{i}")] == [f"m{i}"]


async def test_concurrent_operations_inside_an_atomic_block_that_fails_all_roll_back(
    store: statekeel.Store,
) -> None:
    b = store.backend

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with b.atomic():
            await asyncio.gather(
                *(b.append_messages(f"s{i}", 0, [_msg(store, f"m{i}")], create=True) for i in range(8))
            )
            raise Boom
    for i in range(8):
        assert await b.load_session(f"s{i}") is None
