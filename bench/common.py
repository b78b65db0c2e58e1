"""Helpers the cost benches share: throw-away PostgreSQL databases and the results file."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


async def pg_admin(base: str, sql: str) -> None:
    """Run one administrative statement (CREATE / DROP DATABASE, ANALYZE) on the server at ``base``."""
    import asyncpg

    conn = await asyncpg.connect(base)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextmanager
def pg_databases(admin_url: str, count: int) -> Iterator[list[str]]:
    """URLs of ``count`` new, empty databases on the server of ``admin_url`` (…/postgres), dropped after."""
    names = [f"sk_bench_{uuid.uuid4().hex[:8]}" for _ in range(count)]
    for name in names:
        asyncio.run(pg_admin(admin_url, f'CREATE DATABASE "{name}"'))
    try:
        yield [admin_url.rsplit("/", 1)[0] + f"/{name}" for name in names]
    finally:
        for name in names:
            asyncio.run(pg_admin(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def write_results(prefix: str, results: dict[str, Any]) -> None:
    """Save a run as ``bench/results/<prefix>-<time>.json`` (gitignored) and say where."""
    out = os.path.join(HERE, "results", f"{prefix}-{dt.datetime.now():%Y%m%d-%H%M%S}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(results, fh, indent=2)
    print("wrote", os.path.relpath(out, os.path.dirname(HERE)))
