"""The MySQL dialect's :class:`~statekeel.backends.sql.Tx`: named queries (scripts) on one connection."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any, cast

from asyncmy import errors as my

from ...codec import Codec
from ...errors import PayloadTooLarge
from ..sql import Row, Tx
from .errors import duplicate_key
from .queries import Script, Statement

# Room left in a packet for the statement's text around its values.
_PACKET_MARGIN = 64 * 1024
_NO_LIMIT = 2**63 - 1
_EXACT_FROM = 64 * 1024
_ESCAPED_TEXT = ("'", '"', "\\", "\n", "\r", "\x00", "\x1a")
_ESCAPED_BYTES = tuple(c.encode() for c in _ESCAPED_TEXT)


class MyRow:
    """A result row, by column name or position (as asyncpg's and sqlite3's rows are)."""

    __slots__ = ("_index", "_values")

    def __init__(self, values: tuple[Any, ...], index: dict[str, int]) -> None:
        self._values = values
        self._index = index

    def __getitem__(self, key: str | int, /) -> Any:
        if isinstance(key, str):
            return self._values[self._index[key]]
        return self._values[key]

    def __iter__(self) -> Any:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"MyRow({dict(zip(self._index, self._values, strict=False))!r})"


def _rows(cursor: Any, raw: Sequence[tuple[Any, ...]]) -> list[Row]:
    index: dict[str, int] = {}
    for i, column in enumerate(cursor.description):
        index.setdefault(column[0], i)  # the first of two equal names wins, as with SELECT a.*, b.*
    return [MyRow(tuple(r), index) for r in raw]


class MyTx(Tx):
    __slots__ = ("broken", "codec", "conn", "lock", "max_packet", "scripts")

    def __init__(self, conn: Any, codec: Codec, scripts: dict[str, Script], max_packet: int) -> None:
        self.conn = conn
        self.codec = codec
        self.scripts = scripts
        self.max_packet = max_packet
        # An atomic() block's operations may come from several tasks at once; one connection runs one
        # query at a time, so they take turns.
        self.lock = asyncio.Lock()
        # Set when the server ended an atomic() block's transaction under it (a deadlock, a lost
        # connection): the block can then only roll back.
        self.broken: BaseException | None = None

    def _check_size(self, name: str, args: Sequence[Any]) -> None:
        # What the driver sends for each value: its UTF-8 bytes, one more per escaped character. Small
        # values are counted roughly (they cannot reach any packet limit together with their neighbours).
        size = 0
        for value in args:
            if isinstance(value, str):
                if len(value) < _EXACT_FROM:
                    size += len(value) * 4
                else:
                    size += len(value.encode("utf-8", "surrogatepass"))
                    size += sum(value.count(c) for c in _ESCAPED_TEXT)
            elif isinstance(value, bytes | bytearray):
                size += len(value) + 3
                if len(value) >= _EXACT_FROM:
                    size += sum(value.count(c) for c in _ESCAPED_BYTES)
                else:
                    size += len(value)
        if size + _PACKET_MARGIN > self.max_packet:
            raise PayloadTooLarge(
                f"{name}: the values of this write take about {size} bytes, over the MariaDB/MySQL server's "
                f"max_allowed_packet ({self.max_packet} bytes). Nothing was written; store a smaller value "
                "or raise max_allowed_packet on the server",
                size=size,
                max_allowed_packet=self.max_packet,
                hint="",
            )

    async def _statement(self, cur: Any, st: Statement, args: Sequence[Any]) -> tuple[int, list[Row] | None]:
        params = [args[i] for i in st.order]
        for slot in st.limits:
            if params[slot] is None:
                params[slot] = _NO_LIMIT
        try:
            await cur.execute(st.text, params)
        except my.IntegrityError as exc:
            key = duplicate_key(exc)
            if st.duplicate_ok is None or key is None:
                raise
            if "any" not in st.duplicate_ok and key not in st.duplicate_ok:
                raise
            return 0, [] if st.selects or "RETURNING" in st.text.upper() else None
        rows = _rows(cur, await cur.fetchall()) if cur.description else None
        return max(cur.rowcount, 0), rows

    async def _run(self, name: str, args: Sequence[Any]) -> tuple[int, list[Row]]:
        script = self.scripts[name]
        self._check_size(name, args)
        async with self.conn.cursor() as cur:
            simple = script.simple
            if simple is not None:
                count, rows = await self._statement(cur, simple, args)
                return count, rows or []
            return await self._steps(cur, script.statements, list(args))

    async def _steps(
        self, cur: Any, statements: Sequence[Statement], args: list[Any]
    ) -> tuple[int, list[Row]]:
        changed: int | None = None
        skip = False
        last = len(statements) - 1
        for i, st in enumerate(statements):
            if st.otherwise:
                if skip:
                    skip = False
                    continue
                changed = None  # the insert before changed nothing: this statement's count is the query's
            count, rows = await self._statement(cur, st, args)
            if st.modifies and changed is None:
                changed = count
            following = statements[i + 1] if i < last else None
            if following is not None and following.otherwise:
                skip = count > 0
                continue
            if i == last:
                return (count if changed is None else changed), rows or []
            if st.modifies and count == 0:
                return 0, []
            if st.selects:
                if not rows:
                    return 0, []
                if len(rows) > 1:
                    total, out = 0, []
                    for row in rows:
                        n, more = await self._steps(cur, statements[i + 1 :], [*args, *cast(MyRow, row)])
                        total += n
                        out.extend(more)
                    return total, out
                args = [*args, *cast(MyRow, rows[0])]
        return changed or 0, []

    async def execute(self, name: str, *args: Any) -> int:
        count, _ = await self._run(name, args)
        return count

    async def executemany(self, name: str, rows: Iterable[Sequence[Any]]) -> None:
        script = self.scripts[name]
        simple = script.simple
        batch = [list(r) for r in rows]
        if simple is not None and simple.text.upper().startswith("INSERT") and len(batch) > 1:
            for r in batch:
                self._check_size(name, r)
            async with self.conn.cursor() as cur:
                await cur.executemany(simple.text, [[r[i] for i in simple.order] for r in batch])
            return
        for r in batch:
            await self._run(name, r)

    async def fetchone(self, name: str, *args: Any) -> Row | None:
        _, rows = await self._run(name, args)
        return rows[0] if rows else None

    async def fetchall(self, name: str, *args: Any) -> list[Row]:
        _, rows = await self._run(name, args)
        return rows

    def ts_in(self, value: dt.datetime) -> Any:
        return value.astimezone(dt.UTC).replace(tzinfo=None)

    def ts_out(self, value: Any) -> dt.datetime:
        result: dt.datetime = value.replace(tzinfo=dt.UTC)
        return result
