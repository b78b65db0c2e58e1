"""What key rotation (:func:`statekeel.codec.encryption.rotate`) needs from storage, as Protocols: the core
knows no backend, and every backend's ``reseal_rows`` (see ``EncryptionBackend``) fits them."""

from __future__ import annotations

from typing import Any, Protocol


class ResealBatch(Protocol):
    """One batch of a table's rotation: rows read, rows re-sealed, and the cursor of the next batch
    (None at the end of the table)."""

    @property
    def scanned(self) -> int: ...
    @property
    def rewritten(self) -> int: ...
    @property
    def after(self) -> tuple[Any, ...] | None: ...


class Resealer(Protocol):
    """Storage that re-seals a table's encrypted fields under the current key, one batch at a time."""

    async def reseal_rows(self, table: str, *, after: tuple[Any, ...] | None, limit: int) -> ResealBatch:
        """Re-seal up to ``limit`` rows of ``table`` after ``after`` in one transaction."""
        ...


__all__ = ["ResealBatch", "Resealer"]
