"""Geometry of the two drawings the pages hold as inline SVG: a workflow's DAG and a trace's waterfall.

Only numbers and records come out of here; the templates draw them (and escape every text).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

NODE_W, NODE_H, COL_GAP, ROW_GAP, PAD = 180, 46, 64, 18, 12
LABEL_CHARS = 22


@dataclasses.dataclass(frozen=True, slots=True)
class DagStep:
    """What the DAG needs of a workflow step: its name, dependencies, status and task."""

    name: str
    depends_on: tuple[str, ...]
    status: str
    task_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class Node:
    step: DagStep
    x: int
    y: int
    label: str


@dataclasses.dataclass(frozen=True, slots=True)
class Edge:
    source: str
    target: str
    path: str
    status: str  # the status of the dependency: the edge is "done" once it succeeded


@dataclasses.dataclass(frozen=True, slots=True)
class Dag:
    nodes: list[Node]
    edges: list[Edge]
    width: int
    height: int
    node_w: int = NODE_W
    node_h: int = NODE_H


def _short(text: str, limit: int = LABEL_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _depths(steps: Sequence[DagStep]) -> dict[str, int]:
    """Longest path from a root, for each step; steps on a cycle (a damaged store) go after the rest."""
    names = {s.name for s in steps}
    deps = {s.name: [d for d in s.depends_on if d in names and d != s.name] for s in steps}
    depth: dict[str, int] = {}
    remaining = [s.name for s in steps]
    while remaining:
        ready = [n for n in remaining if all(d in depth for d in deps[n])]
        if not ready:
            last = max(depth.values(), default=-1) + 1
            depth.update((n, last) for n in remaining)
            break
        for n in ready:
            depth[n] = max((depth[d] + 1 for d in deps[n]), default=0)
        remaining = [n for n in remaining if n not in depth]
    return depth


def _centre(step: DagStep, row: dict[str, float], index: int) -> tuple[float, int]:
    """Where a step wants to be: the mean row of its dependencies (its own index if it has none)."""
    known = [row[d] for d in step.depends_on if d in row]
    return (sum(known) / len(known) if known else float(index), index)


def dag_layout(steps: Sequence[DagStep]) -> Dag:
    """Columns by depth (dependencies to the left), rows in creation order, then moved towards the rows
    of their dependencies (one barycentre pass) so that edges cross less."""
    depth = _depths(steps)
    columns: dict[int, list[DagStep]] = {}
    for step in steps:
        columns.setdefault(depth[step.name], []).append(step)
    row: dict[str, float] = {}
    for col in sorted(columns):
        members = columns[col]
        if col > 0:
            wanted = sorted((_centre(s, row, i), s.name, s) for i, s in enumerate(members))
            members[:] = [s for _, _, s in wanted]
        for i, s in enumerate(members):
            row[s.name] = i
    nodes: dict[str, Node] = {}
    for col, members in columns.items():
        for i, s in enumerate(members):
            x = PAD + col * (NODE_W + COL_GAP)
            y = PAD + i * (NODE_H + ROW_GAP)
            nodes[s.name] = Node(s, x, y, _short(s.name))
    edges: list[Edge] = []
    for step in steps:
        target = nodes[step.name]
        for dep in step.depends_on:
            source = nodes.get(dep)
            if source is None or dep == step.name:
                continue
            x1, y1 = source.x + NODE_W, source.y + NODE_H // 2
            x2, y2 = target.x, target.y + NODE_H // 2
            mid = (x1 + x2) // 2
            path = f"M{x1},{y1} C{mid},{y1} {mid},{y2} {x2 - 6},{y2}"
            edges.append(Edge(dep, step.name, path, source.step.status))
    cols = max(columns, default=-1) + 1
    rows = max((len(m) for m in columns.values()), default=0)
    width = PAD * 2 + max(cols, 1) * NODE_W + max(cols - 1, 0) * COL_GAP
    height = PAD * 2 + max(rows, 1) * NODE_H + max(rows - 1, 0) * ROW_GAP
    return Dag([nodes[s.name] for s in steps], edges, width, height)


# --- trace waterfall ---------------------------------------------------------------------------------

LABEL_W, BAR_W, ROW_H, AXIS_H = 300, 640, 22, 24


@dataclasses.dataclass(frozen=True, slots=True)
class Bar:
    """One span's row: ``anchor`` names its attributes panel; ``open`` when it has not ended;
    ``orphan`` when its parent span was not recorded."""

    anchor: str
    span: Any
    depth: int
    label: str
    x: float
    width: float
    y: int
    duration: str
    open: bool
    orphan: bool
    note_x: float  # where the duration is written: after the bar, or before it when the bar ends late
    note_anchor: str


@dataclasses.dataclass(frozen=True, slots=True)
class Waterfall:
    bars: list[Bar]
    ticks: list[tuple[float, str]]
    width: int
    height: int
    total: str
    label_w: int = LABEL_W
    row_h: int = ROW_H
    axis_h: int = AXIS_H


def duration_text(delta: dt.timedelta | None) -> str:
    """``1.25 s``, ``340 ms``, ``85 µs`` — or ``open`` for a span that has not ended."""
    if delta is None:
        return "open"
    us = delta / dt.timedelta(microseconds=1)
    if us >= 1_000_000:
        return f"{us / 1e6:.3g} s" if us < 100_000_000 else f"{us / 1e6:.0f} s"
    if us >= 1000:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.0f} µs"


def waterfall(spans: Sequence[Any]) -> Waterfall:
    """Bars by start and duration, each span under its parent (children in start order).

    ``spans`` have ``span_id``, ``parent_span_id``, ``name``, ``kind``, ``started_at`` and ``ended_at``.
    A span that has not ended is drawn up to the trace's last known instant.
    """
    by_id = {s.span_id: s for s in spans}
    children: dict[str, list[Any]] = {}
    roots: list[Any] = []
    for s in spans:
        parent = s.parent_span_id
        if parent is not None and parent in by_id and parent != s.span_id:
            children.setdefault(parent, []).append(s)
        else:
            roots.append(s)

    def order(items: list[Any]) -> list[Any]:
        return sorted(items, key=lambda s: (s.started_at, s.span_id))

    ordered: list[tuple[Any, int]] = []
    seen: set[str] = set()
    stack = [(s, 0) for s in reversed(order(roots))]
    while stack:
        span, depth = stack.pop()
        if span.span_id in seen:
            continue
        seen.add(span.span_id)
        ordered.append((span, depth))
        stack.extend((c, depth + 1) for c in reversed(order(children.get(span.span_id, []))))
    # Spans only reachable through a cycle of parents (a damaged store) are shown at the top level.
    ordered.extend((s, 0) for s in order([s for s in spans if s.span_id not in seen]))

    if spans:
        t0 = min(s.started_at for s in spans)
        t_end = max(
            max(s.started_at for s in spans), max((s.ended_at for s in spans if s.ended_at), default=t0)
        )
    else:
        t0 = t_end = dt.datetime.now(dt.UTC)
    total = max(t_end - t0, dt.timedelta(microseconds=1))
    scale = BAR_W / (total / dt.timedelta(microseconds=1))

    bars: list[Bar] = []
    right = LABEL_W + BAR_W
    for i, (span, depth) in enumerate(ordered):
        end = span.ended_at if span.ended_at is not None else t_end
        x = min(LABEL_W + ((span.started_at - t0) / dt.timedelta(microseconds=1)) * scale, right - 2.0)
        width = min(max(((end - span.started_at) / dt.timedelta(microseconds=1)) * scale, 2.0), right - x)
        parent = span.parent_span_id
        late = x + width > right - 70
        bars.append(
            Bar(
                anchor=f"span-{i}",
                span=span,
                depth=depth,
                label=_short(span.name, 36 - 2 * min(depth, 8)),
                x=round(x, 1),
                width=round(width, 1),
                y=AXIS_H + i * ROW_H,
                duration=duration_text(span.duration),
                open=span.ended_at is None,
                orphan=parent is not None and parent not in by_id,
                note_x=round(x - 4 if late else x + width + 4, 1),
                note_anchor="end" if late else "start",
            )
        )
    ticks = [(LABEL_W + BAR_W * k / 4, duration_text(total * k / 4)) for k in range(5)]
    height = AXIS_H + max(len(bars), 1) * ROW_H + 4
    return Waterfall(bars, ticks, LABEL_W + BAR_W + 16, height, duration_text(total))


__all__ = ["Dag", "DagStep", "Waterfall", "dag_layout", "duration_text", "waterfall"]
