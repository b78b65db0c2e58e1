"""The append-cost chart: cost of one save against the history already stored, per store.

``python bench/chart.py bench/results/<run>.json docs/benchmarks-append-cost.png`` redraws it from a saved
run; ``run.py --chart PATH`` draws it at the end of a run.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

STYLE = {
    "statekeel": ("#1f77b4", "-"),
    "statekeel-full": ("#1f77b4", "--"),
    "sqlite3": ("#7f7f7f", "-"),
    "sqlite3-full": ("#7f7f7f", "--"),
    "original-design": ("#d62728", "-"),
    "openai-agents": ("#2ca02c", "-"),
    "langgraph": ("#9467bd", "-"),
}


def _smooth(values: list[float], window: int = 15) -> list[float]:
    half = window // 2
    return [statistics.median(values[max(0, i - half) : i + half + 1]) for i in range(len(values))]


def draw(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.2), dpi=110)
    for name, curve in result["w1_per_turn_median_s"].items():
        color, dash = STYLE.get(name, (None, "-"))
        xs = [4 * (i + 1) for i in range(len(curve))]
        ax.plot(xs, [v * 1e3 for v in _smooth(curve)], dash, color=color, label=name, linewidth=1.6)
    ax.set_yscale("log")
    ax.set_xlabel("messages in the session after the save (4 per turn)")
    ax.set_ylabel("one save (ms, log scale)")
    meta = result["meta"]
    ax.set_title(
        f"Append cost against history length — W1, median of {meta['repeats']} repeats per turn "
        "(rolling median of 15 turns)",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        draw(json.load(fh), sys.argv[2])
