"""Page times of ``statekeel ui`` on the large store (100k sessions, 1M messages, and one session of 2,000).

A ``statekeel ui`` process serves the cached large store (see ``bench/large.py``, built on first use); this
script fetches pages over HTTP on one keep-alive connection and reports the median and 95th percentile of
the full request (query, rendering, transfer) and the page size:

- the session list (first page, a page 200 cursors deep, and filtered by status);
- the transcript of the 2,000-message session;
- the overview (counts over the whole store) and the task board.

    python bench/ui.py                 # about a minute once the dataset exists
    python bench/ui.py --repeats 50
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import time
from html import unescape
from typing import Any
from urllib.parse import urlsplit

from large import BIG_KEY, dataset

DEEP_PAGES = 200


def fetch(conn: http.client.HTTPConnection, path: str) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    elapsed = time.perf_counter() - t0
    assert response.status == 200, (path, response.status, body[:300])
    return elapsed, body


def older_link(body: bytes) -> str:
    found = re.search(rb'href="(/sessions\?[^"]*cursor=[^"]+)">older', body)
    assert found, "the session list has no link to older sessions"
    return unescape(found.group(1).decode())


def timed(conn: http.client.HTTPConnection, path: str, repeats: int) -> dict[str, Any]:
    fetch(conn, path)  # warm: templates compiled, pages of the database in the OS cache
    times, size = [], 0
    for _ in range(repeats):
        elapsed, body = fetch(conn, path)
        times.append(elapsed)
        size = len(body)
    times.sort()
    return {
        "median_ms": round(statistics.median(times) * 1000, 2),
        "p95_ms": round(times[min(len(times) - 1, int(len(times) * 0.95))] * 1000, 2),
        "bytes": size,
    }


def measure(base: str, repeats: int) -> dict[str, Any]:
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=120)
    results: dict[str, Any] = {}
    results["session list, first page"] = timed(conn, "/sessions", repeats)
    path = "/sessions"
    for _ in range(DEEP_PAGES):  # follow the cursor, as a person paging back would
        path = older_link(fetch(conn, path)[1])
    results[f"session list, page {DEEP_PAGES + 1} (by cursor)"] = timed(conn, path, repeats)
    results["session list, status=active"] = timed(conn, "/sessions?status=active", repeats)
    transcript = f"/session?key={BIG_KEY}"
    body = fetch(conn, transcript)[1]
    assert body.count(b'<article class="msg') == 2000, "the transcript does not show 2,000 messages"
    results["transcript, 2,000 messages"] = timed(conn, transcript, repeats)
    results["overview (counts)"] = timed(conn, "/", max(5, repeats // 4))
    results["task board"] = timed(conn, "/tasks", repeats)
    conn.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--sessions", type=int, default=100_000)
    args = parser.parse_args()

    def progress(done: int, total: int) -> None:
        print(f"\rbuilding {done}/{total}", end="", flush=True)

    path = asyncio.run(dataset(args.sessions, 10, progress))
    proc = subprocess.Popen(
        [sys.executable, "-m", "statekeel.cli", "ui", "--db", f"sqlite:///{path}", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        found = re.search(r"at (http://\S+)", proc.stdout.readline())
        assert found, "statekeel ui did not start"
        results = measure(found.group(1), args.repeats)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    print(f"store: {os.path.getsize(path) / 1e6:.0f} MB, {args.sessions} sessions + the 2,000-message one")
    width = max(len(name) for name in results)
    print(f"{'page':<{width}}  median ms  p95 ms   bytes")
    for name, r in results.items():
        print(f"{name:<{width}}  {r['median_ms']:>9}  {r['p95_ms']:>6}  {r['bytes']:>7}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
