"""Numbered migrations shipped as ``.sql`` files, shared rules for every SQL dialect.

Files are named ``NNNN_name.sql`` in a dialect's ``migrations`` package, versions dense from 1. Each applied
migration is recorded as one ``schema_migrations`` row (version, name, checksum, applied_at) in the same
transaction as its statements.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from ...errors import MigrationError, SchemaTooNew
from ..base import MigrationInfo

_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def load_migrations(package: str) -> list[Migration]:
    """The migrations shipped in ``package``, in version order; refuses gaps and duplicates."""
    found: list[Migration] = []
    for entry in resources.files(package).iterdir():
        m = _FILE_RE.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda mig: mig.version)
    for expected, mig in enumerate(found, start=1):
        if mig.version != expected:
            raise RuntimeError(
                f"migrations of {package} are not dense: expected {expected}, got {mig.version}"
            )
    return found


def pending(applied: Sequence[MigrationInfo], known: Sequence[Migration], *, where: str) -> list[Migration]:
    """The migrations still to apply. Raises for a newer schema or an edited migration, writing nothing."""
    latest = max((a.version for a in applied), default=0)
    if latest > len(known):
        raise SchemaTooNew(
            f"{where} has schema version {latest}, this statekeel knows up to {len(known)}",
            found=latest,
            supported=len(known),
        )
    by_version = {m.version: m for m in known}
    for info in applied:
        mig = by_version[info.version]
        if info.checksum != mig.checksum:
            raise MigrationError(
                f"{where}: applied migration {info.version} ({info.name}) differs from the shipped file "
                f"{mig.version:04d}_{mig.name}.sql (checksum {info.checksum[:12]} != {mig.checksum[:12]}); "
                "a migration was edited after release. Nothing was changed: use the statekeel release whose "
                "migration files match the database",
                version=info.version,
                hint="",
            )
    done = {a.version for a in applied}
    return [m for m in known if m.version not in done]


def refuse_upgrade(todo: Sequence[Migration], applied: Sequence[MigrationInfo], *, where: str) -> None:
    """For a store opened with ``migrate=False``: refuse, writing nothing, when migrations are pending."""
    if todo:
        current = max((a.version for a in applied), default=0)
        raise MigrationError(
            f"{where} is at schema version {current}; this statekeel needs version {todo[-1].version} "
            f"({len(todo)} migration(s) pending). It was opened with migrate=False, so nothing was changed: "
            "open it with migrate=True (the default) to upgrade it",
            version=current,
            pending=[m.version for m in todo],
            hint="",
        )
