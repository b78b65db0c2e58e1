"""``copy_store``: opens the two stores a copy runs between (given as URLs or open stores) and hands
their backends to :func:`statekeel.copy.copy_backend`. It sits above :mod:`statekeel.store`, which never
imports it."""

from __future__ import annotations

from .copy import CopyReport, ProgressCallback, check_copy_options, copy_backend
from .errors import InvalidArgument
from .store import Store, open_store


async def copy_store(
    src: str | Store,
    dst: str | Store,
    *,
    batch_size: int = 1000,
    resume: bool = False,
    overwrite: bool = False,
    on_batch: ProgressCallback | None = None,
) -> CopyReport:
    """Copy every state kind from store ``src`` to store ``dst`` (URLs, or open :class:`Store` objects).
    See :mod:`statekeel.copy`.

    ``resume=True`` continues an interrupted copy into the same destination; ``overwrite=True`` empties a
    non-empty destination first. ``on_batch(table, rows_copied_so_far)`` is called after each committed
    batch. Raises ``ConflictError`` for a non-empty destination (neither flag given) and when the counts
    differ at the end (each message says what to do; no other writer is involved); stores given as URLs
    are opened (and migrated) and closed again.
    """
    check_copy_options(batch_size, resume, overwrite)
    for name, value in (("src", src), ("dst", dst)):
        if not isinstance(value, str | Store):
            raise InvalidArgument(f"{name} must be a store URL or a Store, got {type(value).__name__}")
    if src is dst or (isinstance(src, str) and src == dst):
        raise InvalidArgument("source and destination are the same store")
    if isinstance(src, str) and src.startswith("memory:"):
        raise InvalidArgument("a memory:// URL opens a new, empty store; pass the open Store instead")
    owned: list[Store] = []
    try:
        source = src if isinstance(src, Store) else await _owned(src, owned)
        dest = dst if isinstance(dst, Store) else await _owned(dst, owned)
        return await copy_backend(
            source.backend,
            dest.backend,
            batch_size=batch_size,
            resume=resume,
            overwrite=overwrite,
            on_batch=on_batch,
        )
    finally:
        for store in owned:
            await store.close()


async def _owned(url: str, owned: list[Store]) -> Store:
    store = await open_store(url)
    owned.append(store)
    return store


__all__ = ["copy_store"]
