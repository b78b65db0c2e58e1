"""The geometry of the drawings: a workflow's DAG (columns by depth, every edge from a dependency to the
left) and a trace's waterfall (bars by start and duration, children under their parent)."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

from statekeel.ui.layout import BAR_W, LABEL_W, DagStep, dag_layout, duration_text, waterfall

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def step(name: str, *deps: str, status: str = "pending") -> DagStep:
    return DagStep(name, deps, status, f"task-{name}")


def test_dag_puts_each_step_right_of_its_dependencies() -> None:
    dag = dag_layout([step("a"), step("b", "a"), step("c", "a"), step("d", "b", "c"), step("e")])
    x = {n.step.name: n.x for n in dag.nodes}
    assert x["a"] == x["e"] < x["b"] == x["c"] < x["d"]
    assert sorted((e.source, e.target) for e in dag.edges) == [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]
    assert all(n.x + dag.node_w <= dag.width and n.y + dag.node_h <= dag.height for n in dag.nodes)


def test_dag_of_a_damaged_store_with_a_cycle_or_unknown_dependency_still_draws() -> None:
    dag = dag_layout([step("a", "b"), step("b", "a"), step("c", "ghost")])
    assert {n.step.name for n in dag.nodes} == {"a", "b", "c"}
    assert {(e.source, e.target) for e in dag.edges} == {("b", "a"), ("a", "b")}


def span(span_id: str, parent: str | None, start_ms: int, end_ms: int | None) -> SimpleNamespace:
    started = T0 + dt.timedelta(milliseconds=start_ms)
    ended = None if end_ms is None else T0 + dt.timedelta(milliseconds=end_ms)
    return SimpleNamespace(
        span_id=span_id,
        parent_span_id=parent,
        name=span_id,
        kind="tool",
        status="ok",
        started_at=started,
        ended_at=ended,
        duration=None if ended is None else ended - started,
    )


def test_waterfall_nests_children_under_their_parent_in_start_order() -> None:
    chart = waterfall(
        [
            span("late-child", "root", 600, 900),
            span("root", None, 0, 1000),
            span("child", "root", 100, 500),
            span("grandchild", "child", 200, 300),
        ]
    )
    assert [(b.span.span_id, b.depth) for b in chart.bars] == [
        ("root", 0),
        ("child", 1),
        ("grandchild", 2),
        ("late-child", 1),
    ]
    root, child = chart.bars[0], chart.bars[1]
    assert (root.x, root.width) == (LABEL_W, BAR_W)
    assert child.x == LABEL_W + BAR_W * 0.1 and child.width == BAR_W * 0.4
    assert [b.y for b in chart.bars] == sorted(b.y for b in chart.bars)


def test_waterfall_marks_open_spans_and_spans_whose_parent_is_missing() -> None:
    chart = waterfall(
        [span("root", None, 0, 100), span("open", "root", 50, None), span("lost", "gone", 60, 80)]
    )
    by_id = {b.span.span_id: b for b in chart.bars}
    assert by_id["open"].open and by_id["open"].x + by_id["open"].width == LABEL_W + BAR_W
    assert by_id["open"].duration == "open"
    assert by_id["lost"].orphan and by_id["lost"].depth == 0 and not by_id["root"].orphan


def test_waterfall_survives_a_cycle_of_parents() -> None:
    chart = waterfall([span("a", "b", 0, 10), span("b", "a", 5, 10)])
    assert sorted(b.span.span_id for b in chart.bars) == ["a", "b"]


def test_durations_read_in_their_unit() -> None:
    ms = dt.timedelta(milliseconds=1)
    assert [duration_text(d) for d in (None, ms / 1000 * 85, ms * 340, ms * 1250, ms * 250_000)] == [
        "open",
        "85 µs",
        "340 ms",
        "1.25 s",
        "250 s",
    ]
