"""Copy a whole store to another backend: ``await statekeel.copy_store(src_url, dst_url)`` opens the two
stores (see :mod:`statekeel.store`) and hands their backends to :func:`copy_backend`, which this module
holds; it knows backends only, never the ``Store`` facade.

Every state kind that exists is copied table by table (parents first), in batches of ``batch_size`` rows,
each batch one transaction in the destination. Rows are copied verbatim — sequence numbers, versions,
timestamps, hashes — so the copy behaves exactly like the source (an audit chain still verifies).

The destination is its own checkpoint: pages follow the primary key in byte order on every backend, so an
interrupted copy leaves a prefix of each table behind, and ``resume=True`` continues after the last key
the destination holds. A destination that already holds data is refused unless ``resume=True`` or
``overwrite=True`` (which empties it first). At the end the row counts of every table are compared, then
every row (JSON columns by value).

The source should be quiet while it is copied (stop the agents, or copy a snapshot): rows written to it
meanwhile may be missed, and the check then fails with ``ConflictError``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from .backends.base import CopyTableInfo, StorageBackend
from .errors import ConflictError, InvalidArgument


@dataclass(frozen=True, slots=True)
class TableCopy:
    """What happened to one table: rows copied by this call, and the verified counts at the end."""

    table: str
    copied: int
    source_rows: int
    destination_rows: int
    resumed_after: tuple[object, ...] | None = None


@dataclass(frozen=True, slots=True)
class CopyReport:
    """The outcome of :func:`copy_store`: one :class:`TableCopy` per table, in copy order."""

    tables: tuple[TableCopy, ...]
    resumed: bool
    overwritten: bool
    seconds: float

    @property
    def copied(self) -> int:
        """Rows copied by this call, all tables together."""
        return sum(t.copied for t in self.tables)

    @property
    def verified(self) -> bool:
        """Every table holds as many rows in the destination as in the source."""
        return all(t.source_rows == t.destination_rows for t in self.tables)


ProgressCallback = Callable[[str, int], object]


def check_copy_options(batch_size: int, resume: bool, overwrite: bool) -> None:
    """``InvalidArgument`` for a ``batch_size`` outside [1, 100000], or both ``resume`` and ``overwrite``."""
    if type(batch_size) is not int or not 1 <= batch_size <= 100_000:
        raise InvalidArgument(f"batch_size must be an int in [1, 100000], got {batch_size!r}")
    if resume and overwrite:
        raise InvalidArgument("pass resume=True or overwrite=True, not both")


async def copy_backend(
    source: StorageBackend,
    dest: StorageBackend,
    *,
    batch_size: int = 1000,
    resume: bool = False,
    overwrite: bool = False,
    on_batch: ProgressCallback | None = None,
) -> CopyReport:
    """Copy every table of ``source`` into ``dest`` as :func:`statekeel.copy_store` describes (it opens
    the stores; this takes their backends)."""
    check_copy_options(batch_size, resume, overwrite)
    started = time.monotonic()
    await _refuse_same_database(source, dest)
    infos = await source.copy_tables()
    filled = await _prepare_destination(dest, infos, resume=resume, overwrite=overwrite)
    copied = [await _copy_table(source, dest, info, batch_size, resume, on_batch) for info in infos]
    verified = [await _verify_count(source, dest, item) for item in copied]
    for info in infos:
        await _compare(source, dest, info, batch_size)
    return CopyReport(
        tables=tuple(verified),
        resumed=resume,
        overwritten=overwrite and bool(filled),
        seconds=time.monotonic() - started,
    )


async def _link(src_b: StorageBackend, dst_b: StorageBackend, table: str, batch_size: int) -> None:
    # Self-references (a task's parent) may point forward in key order, so they are set once every
    # row of the table is in. Idempotent: a resumed copy simply sets them again.
    after = None
    while True:
        page = await src_b.export_rows(table, after=after, limit=batch_size)
        if not page.rows:
            return
        await dst_b.link_rows(table, page.rows)
        after = page.last_key


def _same_row(info: CopyTableInfo, a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    if len(a) != len(b):
        return False
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x == y:
            continue
        # JSON text differs by backend (PostgreSQL's JSONB reformats it): compare the values.
        if i in info.json_columns and isinstance(x, str) and isinstance(y, str):
            try:
                if orjson.loads(x) == orjson.loads(y):
                    continue
            except orjson.JSONDecodeError:
                pass
        return False
    return True


async def _compare(
    src_b: StorageBackend, dst_b: StorageBackend, info: CopyTableInfo, batch_size: int
) -> None:
    # Counts alone miss rows the source changed after a resumed copy had passed them: compare every row,
    # both sides paged in the same key order.
    after_src = after_dst = None
    seen = 0
    while True:
        src_page = await src_b.export_rows(info.name, after=after_src, limit=batch_size)
        dst_page = await dst_b.export_rows(info.name, after=after_dst, limit=batch_size)
        for a, b in itertools.zip_longest(src_page.rows, dst_page.rows):
            if a is None or b is None or not _same_row(info, a, b):
                raise ConflictError(
                    f"after copying, row {seen + 1} of {info.name} (in key order) differs between the "
                    "source and the destination; was the source written to during the copy? Copy again "
                    "with overwrite=True",
                    table=info.name,
                    row=seen + 1,
                    hint="",
                )
            seen += 1
        if not src_page.rows:
            return
        after_src, after_dst = src_page.last_key, dst_page.last_key


async def _refuse_same_database(src_b: StorageBackend, dst_b: StorageBackend) -> None:
    # Two URLs (or two open stores) may name one database: overwrite would then empty the source itself.
    same = await src_b.store_identity()
    if same is not None and same == await dst_b.store_identity():
        raise InvalidArgument(
            f"source and destination are the same database ({same}); copy into another store",
            identity=same,
        )


async def _prepare_destination(
    dst_b: StorageBackend, infos: list[CopyTableInfo], *, resume: bool, overwrite: bool
) -> dict[str, int]:
    """Check that the destination can take the copy, and empty it for ``overwrite``; returns the row counts
    of the tables it held rows in."""
    tables = [info.name for info in infos]
    missing = sorted(set(tables) - {info.name for info in await dst_b.copy_tables()})
    if missing:
        raise InvalidArgument(
            f"the destination has no table {', '.join(missing)}; open it with a statekeel that knows them"
        )
    filled = {t: n for t in tables if (n := await dst_b.count_rows(t))}
    if filled and not (resume or overwrite):
        first = next(iter(filled))
        raise ConflictError(
            f"the destination is not empty ({first} holds {filled[first]} rows); pass resume=True to "
            "continue an interrupted copy, or overwrite=True to replace its contents",
            table=first,
            rows=filled[first],
            hint="",
        )
    if overwrite and filled:
        kept = [info.name for info in infos if info.append_only and info.name in filled]
        if kept:
            raise ConflictError(
                f"overwrite=True cannot empty {', '.join(kept)} of the destination: audit entries, "
                "approvals and unresolved contradictions are never deleted; copy into a new, empty store "
                "instead",
                table=kept[0],
                rows=filled[kept[0]],
                hint="",
            )
        async with dst_b.atomic():
            for table in reversed(tables):
                await dst_b.clear_rows(table)
    return filled


async def _copy_table(
    src_b: StorageBackend,
    dst_b: StorageBackend,
    info: CopyTableInfo,
    batch_size: int,
    resume: bool,
    on_batch: ProgressCallback | None,
) -> TableCopy:
    """Copy one table page by page (after the destination's last key when resuming), then its links;
    the counts are filled in by :func:`_verify_count`."""
    after = await dst_b.last_key(info.name) if resume else None
    resumed_after = after
    copied = 0
    while True:
        page = await src_b.export_rows(info.name, after=after, limit=batch_size)
        if not page.rows:
            break
        await dst_b.import_rows(info.name, page.rows)
        copied += len(page.rows)
        after = page.last_key
        if on_batch is not None:
            on_batch(info.name, copied)
        if len(page.rows) < batch_size:
            break
    if info.links:
        await _link(src_b, dst_b, info.name, batch_size)
    return TableCopy(info.name, copied, 0, 0, resumed_after)


async def _verify_count(src_b: StorageBackend, dst_b: StorageBackend, item: TableCopy) -> TableCopy:
    src_n = await src_b.count_rows(item.table)
    dst_n = await dst_b.count_rows(item.table)
    if src_n != dst_n:
        raise ConflictError(
            f"after copying, {item.table} holds {dst_n} rows in the destination but {src_n} in the "
            "source; was the source written to during the copy? Copy again with overwrite=True",
            table=item.table,
            source_rows=src_n,
            destination_rows=dst_n,
            hint="",
        )
    return TableCopy(item.table, item.copied, src_n, dst_n, item.resumed_after)


__all__ = ["CopyReport", "ProgressCallback", "TableCopy", "check_copy_options", "copy_backend"]
