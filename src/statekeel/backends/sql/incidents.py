"""Incidents: damage statekeel found in its own storage (a WAL file deleted before its commits were
checkpointed, …), recorded once and reported by ``recover()`` and ``info()`` until acknowledged."""

from __future__ import annotations

from ..base import Incident, IncidentBackend
from . import Row, SqlBackend, Tx, utcnow
from .tasks import ts_or_none


def incident_from_row(tx: Tx, row: Row) -> Incident:
    return Incident(
        id=row["id"],
        kind=row["kind"],
        detected_at=tx.ts_out(row["detected_at"]),
        detail=tx.json_out(row["detail"]),
        acknowledged_at=ts_or_none(tx, row["acknowledged_at"]),
        acknowledged_by=row["acknowledged_by"],
    )


async def op_record_incident(tx: Tx, kind: str, detail: bytes) -> Incident:
    row = await tx.fetchone("incident_insert", kind, tx.ts_in(utcnow()), detail.decode("utf-8"))
    assert row is not None
    return incident_from_row(tx, row)


async def op_list_incidents(tx: Tx, include_acknowledged: bool) -> list[Incident]:
    return [incident_from_row(tx, r) for r in await tx.fetchall("incident_list", include_acknowledged)]


async def op_acknowledge_incident(tx: Tx, incident_id: int, by: str) -> Incident | None:
    row = await tx.fetchone("incident_acknowledge", incident_id, tx.ts_in(utcnow()), by)
    return None if row is None else incident_from_row(tx, row)


class SqlIncidents(SqlBackend, IncidentBackend):
    """The incident contract over the shared operations above."""

    async def record_incident(self, kind: str, detail: bytes) -> Incident:
        return await self._write(op_record_incident, kind, detail)

    async def list_incidents(self, *, include_acknowledged: bool = False) -> list[Incident]:
        return await self._read(op_list_incidents, include_acknowledged)

    async def acknowledge_incident(self, incident_id: int, by: str) -> Incident | None:
        return await self._write(op_acknowledge_incident, incident_id, by)
