"""Export and import costs: ``python bench/export.py [--sizes 10000 100000] [--pg URL]``.

For each size, a SQLite store of that many sessions (4 messages each, filled as in ``bench/erase.py``) is
exported with ``statekeel.export_store`` and the file imported into a new SQLite store (and, with
``--pg``, into a new PostgreSQL database) with ``statekeel.import_store``. Each export and import runs in
a process of its own, which reports its peak resident memory: the same peak at every size shows that
both stream (constant memory in the store's size). Writes ``bench/results/export-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import statekeel  # noqa: E402
from common import pg_databases, write_results  # noqa: E402
from erase import fill  # noqa: E402


async def _child(what: str, url: str, path: str) -> dict[str, Any]:
    began = time.perf_counter()
    async with statekeel.open_store(url) as store:
        if what == "export":
            report: Any = await statekeel.export_store(store, path)
        else:
            report = await statekeel.import_store(store, path)
    return {
        "seconds": round(time.perf_counter() - began, 2),
        "records": report.records,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _run(what: str, url: str, path: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", what, url, path], capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--pg", default=None, metavar="URL", help="also import into PostgreSQL (…/postgres)")
    parser.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_child(*args.child))))
        return
    results: dict[str, Any] = {}
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            src, path = f"sqlite:///{os.path.join(tmp, 'src.db')}", os.path.join(tmp, "state.jsonl")
            asyncio.run(fill(src, size, 10))
            row: dict[str, Any] = {"export": _run("export", src, path)}
            row["file_mb"] = round(os.path.getsize(path) / 1e6, 1)
            row["import_sqlite"] = _run("import", f"sqlite:///{os.path.join(tmp, 'dst.db')}", path)
            if args.pg:
                with pg_databases(args.pg, 1) as (pg,):
                    row["import_postgresql"] = _run("import", pg, path)
            results[str(size)] = row
            print(size, row)
    write_results("export", results)


if __name__ == "__main__":
    main()
