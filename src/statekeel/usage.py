"""Usage: what each turn cost, recorded with the message it produced.

    session.add_message("assistant", text, usage={"model": "gpt-5", "input_tokens": 812,
                                                  "output_tokens": 95, "cost": 0.0031})
    totals = await store.sessions.usage(key)      # Usage: totals, and per model in totals.by_model

A usage is a mapping with a non-empty ``model`` name and, each optional (0 when left out), non-negative
int ``input_tokens`` and ``output_tokens`` and a finite non-negative ``cost`` (an int or float, in the
caller's currency). Anything else raises ``InvalidArgument`` before anything is added or written.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidArgument
from .validation import check_int

__all__ = ["ModelUsage", "Usage", "check_usage", "total_usage"]

_FIELDS = ("model", "input_tokens", "output_tokens", "cost")


@dataclass(frozen=True, slots=True)
class ModelUsage:
    """The usage of one model over a session's history: ``turns`` messages recorded a usage."""

    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    turns: int = 0


@dataclass(frozen=True, slots=True)
class Usage:
    """A session's usage: totals over every message of its history that recorded one (a fork counts the
    part it shares with its parent once: its history holds it once; rewound messages are not counted),
    and the same per model in ``by_model``."""

    key: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    turns: int = 0
    by_model: dict[str, ModelUsage] = field(default_factory=dict)


def check_usage(usage: Any) -> dict[str, Any]:
    """The usage as stored (every field present), or ``InvalidArgument`` saying what is wrong."""
    if not isinstance(usage, Mapping):
        raise InvalidArgument(
            f"usage must be a mapping like {{'model': 'gpt-5', 'input_tokens': 10, 'output_tokens': 5, "
            f"'cost': 0.001}}, got {type(usage).__name__}"
        )
    unknown = sorted(str(k) for k in usage if k not in _FIELDS)
    if unknown:
        raise InvalidArgument(f"usage has unknown fields {unknown}; it takes {', '.join(_FIELDS)}")
    model = usage.get("model")
    if type(model) is not str or not model.strip() or "\x00" in model:
        raise InvalidArgument(f"usage['model'] must be a non-empty str naming the model, got {model!r}")
    tokens = {
        name: check_int(usage.get(name, 0), f"usage[{name!r}]") for name in ("input_tokens", "output_tokens")
    }
    cost = usage.get("cost", 0)
    if type(cost) not in (int, float) or not math.isfinite(cost) or cost < 0:
        raise InvalidArgument(f"usage['cost'] must be a finite non-negative number, got {cost!r}")
    return {"model": model, **tokens, "cost": float(cost)}


def total_usage(key: str, usages: Iterable[Mapping[str, Any]]) -> Usage:
    """Sum stored usages into a :class:`Usage`."""
    per: dict[str, list[Any]] = {}
    for u in usages:
        row = per.setdefault(u["model"], [0, 0, 0.0, 0])
        row[0] += u["input_tokens"]
        row[1] += u["output_tokens"]
        row[2] += u["cost"]
        row[3] += 1
    by_model = {m: ModelUsage(m, r[0], r[1], r[2], r[3]) for m, r in sorted(per.items())}
    return Usage(
        key,
        sum(m.input_tokens for m in by_model.values()),
        sum(m.output_tokens for m in by_model.values()),
        math.fsum(r[2] for r in per.values()),
        sum(m.turns for m in by_model.values()),
        by_model,
    )
