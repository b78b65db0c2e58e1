"""The regression gate: this code against an older revision, alternately in one run.

    python bench/compare.py --before REV [--after REV|worktree] [--rounds 5] [--quick] [--pg URL]
                            [--fail-above RATIO]

Both sides run the same workloads, at the same sizes, from the same bench code (``workloads.py``,
``stores.py``, ``audit_costs.measure``: nothing is written twice); only the ``statekeel`` package
differs. ``--before`` (and ``--after``, unless it is ``worktree``, the default: this checkout's ``src``)
is extracted with ``git archive`` into a temporary directory, and every measurement runs in a fresh child
process whose ``PYTHONPATH`` starts with that side's ``src`` (the child checks it imported ``statekeel``
from there). Each round runs every workload once per side, the two sides back to back, the side that goes
first alternating between rounds, so both share the machine's load as it drifts.

Workloads (the API every revision has: ``open_store``, ``sessions.get_or_create/save/load``,
``tasks.create/claim/transition/step``):

- W1: one session x 500 turns of 4 messages, one save per turn (total and median save), SQLite at
  durability normal and full;
- W2: a full load of W1's 2,000 messages on a freshly opened store;
- W3: 50 sessions x 20 turns, sessions concurrent;
- tasks: per call, ``tasks.create``, ``tasks.claim``, ``tasks.transition`` to success (fenced) and
  ``tasks.step`` (1,000 tasks), SQLite at durability normal;
- the same on PostgreSQL with ``--pg postgresql://…/postgres`` (a database per measurement, dropped).

``--quick``: 100 turns, 20 x 10 for W3, 200 tasks, 3 rounds (about a minute and a half). Prints, per
figure, each side's median over the rounds, the ratio after/before (the median of the per-round ratios:
each round's two sides ran next to each other, so a round's ratio shares its load), the range of the
per-round ratios and each side's spread ((max - min) / median); writes every
round to ``bench/results/compare-<time>.json``. With ``--fail-above 1.1`` the exit code is 1 when a
figure's ratio exceeds 1.1. ``--report FILE`` prints the table of a saved run again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import audit_costs  # noqa: E402
import stores  # noqa: E402
import workloads  # noqa: E402
from common import pg_databases, write_results  # noqa: E402

W2 = "W2 load of W1's messages"

# (figure, unit) in the order of the table; the PostgreSQL rows repeat the ones at durability normal.
SESSIONS = [("W1 total, normal", "ms"), ("W1 median save, normal", "µs"), (W2, "ms"), ("W3 concurrent", "ms")]
FULL = [("W1 total, full", "ms"), ("W1 median save, full", "µs")]
TASKS = [(f"task {name}", "µs") for name in audit_costs.FIGURES]


# ---------------------------------------------------------------------------------------------- child


class UrlStore(stores.StatekeelSessions):
    """statekeel's session adapter (``stores.StatekeelSessions``) on a store URL; no directory used."""

    name = "statekeel-pg"
    durability = "synchronous_commit"

    def __init__(self, url: str) -> None:
        self.url = url

    async def open(self, directory: str) -> None:
        import statekeel

        self.store = await statekeel.open_store(self.url)

    async def close(self) -> None:
        await self.store.close()

    def db_bytes(self, directory: str) -> int:
        return 0


async def _child_measure(spec: dict[str, Any]) -> dict[str, float]:
    """One workload on one side (runs in the child, whose ``statekeel`` is that side's)."""
    kind, url, work = spec["kind"], spec.get("url"), spec["dir"]
    out: dict[str, float] = {}
    if kind in ("w1", "w1-full"):
        durability = "full" if kind == "w1-full" else "normal"
        adapter: stores.Adapter = UrlStore(url) if url else stores.Statekeel(durability)
        r1 = await workloads.w1(adapter, work, spec["turns"])
        out[f"W1 total, {durability}"] = r1.total_s * 1e3
        out[f"W1 median save, {durability}"] = statistics.median(r1.per_turn_s) * 1e6
        if kind == "w1":
            out[W2] = await workloads.w2(adapter, work, spec["turns"]) * 1e3
    elif kind == "w3":
        adapter = UrlStore(url) if url else stores.Statekeel("normal")
        seconds = await workloads.w3(adapter, work, spec["sessions"], spec["w3_turns"])
        out["W3 concurrent"] = seconds * 1e3
    elif kind == "tasks":
        target = url or f"sqlite:///{os.path.join(work, 'tasks.db')}"
        got = await audit_costs.measure(target, spec["tasks"], "normal")
        for name in audit_costs.FIGURES:
            out[f"task {name}"] = got[name]
    else:
        raise SystemExit(f"unknown workload {kind!r}")
    return out


def child(spec_json: str) -> None:
    """Run one measurement; print the figures (and where ``statekeel`` came from) as JSON."""
    import statekeel

    spec = json.loads(spec_json)
    figures = asyncio.run(_child_measure(spec))
    print(json.dumps({"figures": figures, "statekeel": os.path.abspath(statekeel.__file__)}))


# --------------------------------------------------------------------------------------------- parent


def resolve(rev: str) -> str:
    """The short commit id of ``rev`` (fails clearly if git does not know it)."""
    out = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", f"{rev}^{{commit}}"], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"git does not know revision {rev!r}: {out.stderr.strip()}")
    return out.stdout.strip()


def worktree_label() -> str:
    head = resolve("HEAD")
    dirty = subprocess.run(
        ["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no", "--", "src"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"worktree ({head}{' + changes' if dirty else ''})"


def run_side(src: str, spec: dict[str, Any]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{spec['kind']} failed on {src}:\n{proc.stderr.strip()[-3000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if not got["statekeel"].startswith(os.path.abspath(src) + os.sep):
        raise SystemExit(f"the child imported statekeel from {got['statekeel']}, not from {src}")
    return dict(got["figures"])


def _spread(values: list[float]) -> float:
    """(max - min) / median, in percent."""
    return (max(values) - min(values)) / statistics.median(values) * 100


def summarize(
    runs: dict[str, dict[str, list[float]]], figures: list[tuple[str, str]]
) -> list[dict[str, Any]]:
    rows = []
    for name, unit in figures:
        before, after = runs["before"].get(name), runs["after"].get(name)
        if not before or not after:
            continue
        b, a = statistics.median(before), statistics.median(after)
        paired = [x / y for x, y in zip(after, before, strict=True)]
        rows.append(
            {
                "figure": name,
                "unit": unit,
                "before": b,
                "after": a,
                "ratio": statistics.median(paired),
                "ratio_of_medians": a / b,
                "round_ratio_min": min(paired),
                "round_ratio_max": max(paired),
                "before_spread_pct": _spread(before),
                "after_spread_pct": _spread(after),
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]], before: str, after: str, rounds: int) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"after / before, medians of {rounds} rounds: before = {before}, after = {after}")
    for col in ("figure", "before", "after", "after / before", "per-round ratios", "spread b / a"):
        t.add_column(col, justify="left" if col == "figure" else "right")
    for r in rows:
        fmt = "{:,.2f}" if r["unit"] == "ms" and r["before"] < 100 else "{:,.0f}"
        t.add_row(
            r["figure"],
            fmt.format(r["before"]) + " " + r["unit"],
            fmt.format(r["after"]) + " " + r["unit"],
            f"{r['ratio']:.2f}",
            f"{r['round_ratio_min']:.2f}-{r['round_ratio_max']:.2f}",
            f"{r['before_spread_pct']:.0f}% / {r['after_spread_pct']:.0f}%",
        )
    Console(width=160).print(t)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", help="the older git revision, e.g. main~3 or a commit id")
    parser.add_argument("--after", default="worktree", help="a git revision, or 'worktree' (default)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5, 3 with --quick)")
    parser.add_argument("--quick", action="store_true", help="smaller workloads, 3 rounds")
    parser.add_argument("--pg", default=None, help="admin URL of a PostgreSQL server, e.g. …/postgres")
    parser.add_argument("--fail-above", type=float, default=None, help="exit 1 if a ratio exceeds this")
    parser.add_argument("--workdir", default=None, help="where stores are written (default: a temp dir)")
    parser.add_argument("--report", default=None, help="print the table of a saved run (its JSON file)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child)
        return 0
    if args.report is not None:
        with open(args.report) as fh:
            saved = json.load(fh)
        rows = summarize(saved["runs"], [(f, u) for f, u in saved["figures"]])
        print_table(rows, saved["before"]["commit"], saved["after"]["commit"], saved["rounds"])
        return gate(rows, args.fail_above)
    if args.before is None:
        parser.error("--before REV is required")
    rounds = args.rounds or (3 if args.quick else 5)
    turns, sessions, w3_turns, tasks = (100, 20, 10, 200) if args.quick else (500, 50, 20, 1000)
    sizes = {"turns": turns, "sessions": sessions, "w3_turns": w3_turns, "tasks": tasks}
    labels = {"before": resolve(args.before)}
    labels["after"] = worktree_label() if args.after == "worktree" else resolve(args.after)
    kinds = ["w1", "w3", "w1-full", "tasks"]
    if args.pg:
        kinds += ["pg:w1", "pg:w3", "pg:tasks"]
    figures = SESSIONS + FULL + TASKS
    if args.pg:
        figures += [(f"PG {name}", unit) for name, unit in SESSIONS + TASKS]
    print(
        f"compare: before {labels['before']}, after {labels['after']}; {rounds} rounds; W1 {turns} turns, "
        f"W3 {sessions}x{w3_turns}, {tasks} tasks" + (", PostgreSQL too" if args.pg else ""),
        flush=True,
    )
    started, load_before = time.time(), os.getloadavg()
    runs: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory(prefix="statekeel-compare-", dir=args.workdir) as scratch:
        srcs = {"before": audit_costs.extract(args.before, os.path.join(scratch, "before"))}
        if args.after == "worktree":
            srcs["after"] = os.path.join(ROOT, "src")
        else:
            srcs["after"] = audit_costs.extract(args.after, os.path.join(scratch, "after"))
        for r in range(rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for kind in kinds:
                for side in order:
                    spec = {**sizes, "kind": kind.removeprefix("pg:")}
                    work = tempfile.mkdtemp(prefix=f"{side}-{kind.replace(':', '-')}-", dir=scratch)
                    spec["dir"] = work
                    if kind.startswith("pg:"):
                        with pg_databases(args.pg, 1) as [url]:
                            got = run_side(srcs[side], {**spec, "url": url})
                        got = {f"PG {k}": v for k, v in got.items()}
                    else:
                        got = run_side(srcs[side], spec)
                    for name, value in got.items():
                        runs[side].setdefault(name, []).append(value)
                    print(
                        f"round {r + 1}/{rounds} {kind:>8} {side:>6}: "
                        + "  ".join(f"{k} {v:,.1f}" for k, v in got.items()),
                        flush=True,
                    )
    rows = summarize(runs, figures)
    print()
    print_table(rows, labels["before"], labels["after"], rounds)
    print(f"({time.time() - started:.0f} s)")
    write_results(
        "compare",
        {
            "before": {"rev": args.before, "commit": labels["before"]},
            "after": {"rev": args.after, "commit": labels["after"]},
            "rounds": rounds,
            "sizes": sizes,
            "pg": bool(args.pg),
            "load_average": {"start": load_before, "end": os.getloadavg()},
            "figures": figures,
            "summary": rows,
            "runs": runs,
        },
    )
    return gate(rows, args.fail_above)


def gate(rows: list[dict[str, Any]], limit: float | None) -> int:
    """1 (and a line per figure) when a figure's ratio exceeds ``limit``, else 0."""
    if limit is None:
        return 0
    over = [r for r in rows if r["ratio"] > limit]
    for r in over:
        print(f"REGRESSION: {r['figure']}: after / before = {r['ratio']:.2f} > {limit}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
