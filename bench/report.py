"""Render a saved run as the Markdown tables of docs/benchmarks.md.

``python bench/report.py bench/results/<run>.json`` prints the tables; paste them into the doc after a
re-run so that the doc and the JSON always say the same thing.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}" if seconds >= 0.01 else f"{seconds * 1e3:.2f}"


def _every_other(samples: list[Any]) -> list[Any]:
    """Every other sample, always ending with the last one."""
    picked = samples[::2]
    return picked if picked[-1] is samples[-1] else [*picked, samples[-1]]


def render(result: dict[str, Any]) -> str:
    s = result["summary"]
    meta = result["meta"]
    durability = meta["durability"]
    lines = [
        f"Run of {meta['started']} (git {meta['git']}), {meta['repeats']} repeats, Python {meta['python']}, "
        f"SQLite {meta['sqlite']}, {meta['machine']}; thread round trip in this run: "
        f"{meta.get('thread_round_trip_s', 0) * 1e6:.0f} µs.",
        "",
        "| store | durability | W1 total ms | median save µs | first 50 µs | last 50 µs | growth | W2 ms "
        "| W3 ms | DB MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in s.items():
        lines.append(
            f"| {name} | {durability.get(name, '')} | {_ms(r['w1_total_s'])} "
            f"| {r['w1_turn_median_s'] * 1e6:.0f} "
            f"| {r['w1_first50_s'] * 1e6:.0f} | {r['w1_last50_s'] * 1e6:.0f} | {r['growth']:.2f} "
            f"| {_ms(r['w2_s'])} | {_ms(r['w3_s'])} | {r['db_bytes'] / 1e6:.1f} |"
        )
    big = result.get("large")
    if big:
        m = big["median"]
        lines += [
            "",
            "| with 100k sessions / 1M messages stored | median |",
            "|---|---:|",
            f"| open an up-to-date store | {m['open_s'] * 1e3:.2f} ms |",
            f"| list the 100 most recent sessions, first call after open "
            f"| {m['list100_cold_s'] * 1e3:.2f} ms |",
            f"| list the 100 most recent sessions, warm | {m['list100_warm_s'] * 1e3:.2f} ms |",
            f"| load the 2,000-message session | {m['load2000_large_s'] * 1e3:.2f} ms |",
            f"| load the same session alone in a store | {m['load2000_empty_s'] * 1e3:.2f} ms |",
            f"| database size | {big['db_bytes'] / 1e6:.0f} MB |",
        ]
    rss = result.get("rss")
    if rss and "rss" in rss:
        samples = rss["rss"]
        lines += [
            "",
            f"RSS while touching {rss['sessions']:,} sessions (`cache_size={rss['cache_size']}`, "
            f"{rss['seconds']:.0f} s): "
            + ", ".join(f"{n:,}: {b / 2**20:.1f} MB" for n, b in _every_other(samples))
            + ".",
        ]
    lines += ["", "| target | measured | limit | met |", "|---|---:|---:|---|"]
    for t in result["targets"]:
        met = "yes" if t["met"] else "**no**"
        lines.append(f"| {t['target']} | {t['measured']:.2f} | {t['op']} {t['limit']:g} | {met} |")
    return "\n".join(lines)


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        print(render(json.load(fh)))
