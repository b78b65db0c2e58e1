"""Key rotation of the encrypted fields (see :mod:`statekeel.codec.encryption`)."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EncryptionBackend",
    "ResealPage",
]


@dataclass(frozen=True, slots=True)
class ResealPage:
    """One batch of key rotation on one table: rows read, rows re-encrypted under the current key, and the
    cursor the next batch starts after (None when this one reached the end of the table)."""

    scanned: int
    rewritten: int
    after: tuple[Any, ...] | None


class EncryptionBackend(abc.ABC):
    """Key rotation of the encrypted fields (see :mod:`statekeel.codec.encryption`), one transaction a
    batch."""

    @abc.abstractmethod
    async def reseal_rows(self, table: str, *, after: tuple[Any, ...] | None, limit: int) -> ResealPage:
        """Read up to ``limit`` rows of ``table`` (one of ``statekeel.codec.encryption.ROTATION_TABLES``)
        in key order after ``after`` (None: from the start) and re-seal under the codec's current key each
        encrypted field that is under another key (or, in ``encrypt_existing`` mode, in plaintext), in
        one transaction. A row changed meanwhile by its own writer keeps what that writer wrote."""
