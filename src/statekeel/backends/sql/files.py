"""The file ledger: the operations every SQL dialect shares.

Each record of a path gets the next ``seq`` of that path, read and inserted in one transaction; a writer
that loses the race for a ``seq`` (the primary key refuses it) reads again and takes the next one.
"""

from __future__ import annotations

import datetime as dt

from ...errors import ConflictError
from ..base import FileBackend, FileRecord
from . import Row, SqlBackend, Tx

_TRIES = 100


def file_from_row(tx: Tx, row: Row) -> FileRecord:
    return FileRecord(
        path=row["path"],
        seq=row["seq"],
        checksum=row["checksum"],
        size=row["size"],
        action=row["action"],
        task_id=row["task_id"],
        session_key=row["session_key"],
        recorded_at=tx.ts_out(row["recorded_at"]),
    )


async def op_record_file(
    tx: Tx,
    path: str,
    checksum: str | None,
    size: int | None,
    action: str,
    task_id: str | None,
    session_key: str | None,
    at: dt.datetime,
) -> FileRecord:
    for _ in range(_TRIES):
        last = await tx.fetchone("file_last", path)
        seq, when = 1, at
        if last is not None:
            # The history of a path is in seq order; its times never go back, whatever the clocks.
            seq, when = last["seq"] + 1, max(at, tx.ts_out(last["recorded_at"]))
        row = await tx.fetchone(
            "file_insert", path, seq, checksum, size, action, task_id, session_key, tx.ts_in(when)
        )
        if row is not None:
            return file_from_row(tx, row)
    raise ConflictError(f"the ledger of {path!r} kept changing under {_TRIES} attempts to record", path=path)


async def op_list_files(
    tx: Tx, task_id: str | None, session_key: str | None, path: str | None, limit: int | None
) -> list[FileRecord]:
    if path is not None:
        name = "file_list_path"
    elif task_id is not None:
        name = "file_list_task"
    elif session_key is not None:
        name = "file_list_session"
    else:
        name = "file_list"
    rows = await tx.fetchall(name, task_id, session_key, path, limit)
    return [file_from_row(tx, r) for r in rows]


async def op_last_file_records(
    tx: Tx, after_path: str, limit: int, task_id: str | None, session_key: str | None
) -> list[FileRecord]:
    if task_id is not None:
        name = "file_last_records_task"
    elif session_key is not None:
        name = "file_last_records_session"
    else:
        name = "file_last_records"
    rows = await tx.fetchall(name, after_path, task_id, session_key, limit)
    return [file_from_row(tx, r) for r in rows]


class SqlFiles(SqlBackend, FileBackend):
    """The file ledger contract over the shared operations above."""

    async def record_file(
        self,
        path: str,
        *,
        checksum: str | None,
        size: int | None,
        action: str,
        task_id: str | None,
        session_key: str | None,
        at: dt.datetime,
    ) -> FileRecord:
        return await self._write(op_record_file, path, checksum, size, action, task_id, session_key, at)

    async def list_files(
        self,
        *,
        task_id: str | None = None,
        session_key: str | None = None,
        path: str | None = None,
        limit: int | None = None,
    ) -> list[FileRecord]:
        return await self._read(op_list_files, task_id, session_key, path, limit)

    async def last_file_records(
        self,
        *,
        after_path: str = "",
        limit: int = 1000,
        task_id: str | None = None,
        session_key: str | None = None,
    ) -> list[FileRecord]:
        return await self._read(op_last_file_records, after_path, limit, task_id, session_key)
