"""The story demo's account: told as it happens in the terminal (rich), or as one JSON object."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..wording import counted
from .story import StoryResult
from .story_agent import CRASH_POINTS

_MARK = {
    "ok": "[green]✓[/green]",
    "tool": "[green]✓[/green]",
    "memory": "[green]✓[/green]",
    "user": "[cyan]>[/cyan]",
    "model": "[cyan]<[/cyan]",
    "approval": "[yellow]?[/yellow]",
    "recover": "[magenta]↻[/magenta]",
    "resolve": "[magenta]↻[/magenta]",
}


def describe_recovery(found: dict[str, Any]) -> str:
    """One line of what ``recover()`` found for this run."""
    parts: list[str] = []
    if found.get("orphaned_tool_calls"):
        calls = found["orphaned_tool_calls"]
        parts.append(f"answered {', '.join(calls)} 'interrupted' (asked, never run)")
    if found.get("tool_calls_in_doubt"):
        parts.append(
            f"{counted(len(found['tool_calls_in_doubt']), 'tool call')} in doubt "
            f"({', '.join(found['tool_calls_in_doubt'])})"
        )
    if found.get("steps_in_doubt"):
        parts.append(
            f"{counted(len(found['steps_in_doubt']), 'step')} in doubt "
            f"({', '.join(repr(s) for s in found['steps_in_doubt'])})"
        )
    if found.get("pending_approvals"):
        parts.append(f"{counted(len(found['pending_approvals']), 'approval')} pending")
    if found.get("interrupted_tasks"):
        parts.append(f"{counted(len(found['interrupted_tasks']), 'task')} interrupted")
    if found.get("audit_ok") is False:
        parts.append("the audit chain does NOT verify")
    # The job's own workflow is unfinished until the agent is done: not news.
    return "recover(): " + ("; ".join(parts) or "nothing to repair")


class StoryPrinter:
    """Prints the story as the demo's events arrive."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def header(self, *, store: str, workspace: str, crash_at: int, seed: int | None) -> None:
        c = self.console
        c.print("[bold]statekeel demo[/bold]: an agent fixing a failing test is killed, and resumes")
        c.print(f"  store     {escape(store)}")
        c.print(f"  project   {escape(workspace)}: add() subtracts, 1 of 3 tests fails")
        how = "chosen" if seed is None else f"seed {seed}"
        c.print(f"  crash at  point {crash_at} of {len(CRASH_POINTS)} ({how}):")
        c.print(f"            {escape(CRASH_POINTS[crash_at - 1].label)}")

    def __call__(self, index: int, event: dict[str, Any]) -> None:
        c = self.console
        if "started" in event:
            what = "the agent starts" if index == 1 else "the agent is started again"
            c.print(f"\n[bold]run {index}[/bold]  {what} (pid {event['started']})")
        elif "killed" in event:
            c.print(f"  [red bold]✗ SIGKILL[/red bold] at point {event['killed']}: {escape(event['label'])}")
        elif "recovery" in event:
            c.print(f"  {_MARK['recover']} {escape(describe_recovery(event['recovery']))}")
        elif "say" in event:
            mark = _MARK.get(event.get("tag", "ok"), "·")
            c.print(f"  {mark} {escape(_one_line(event['say']))}")
        elif "approval" in event:
            argv = escape(" ".join(event["args"]["argv"]))
            c.print(f"  {_MARK['approval']} asks approval for `{argv}`: granted (for these args only)")

    def verdict(self, result: StoryResult) -> None:
        c = self.console
        c.print()
        table = Table(title="checks", title_justify="left", title_style="bold", box=None, show_header=False)
        table.add_column(no_wrap=True)
        table.add_column(no_wrap=True)
        table.add_column()
        for check in result.checks:
            mark = "[green]✓[/green]" if check.ok else "[red]✗[/red]"
            table.add_row(mark, check.name, escape(check.detail))
        c.print(table)
        if result.ok:
            c.print(f"[green bold]ok[/green bold]: every check passed in {result.elapsed_s:.1f} s")
        else:
            failed = ", ".join(ch.name for ch in result.checks if not ch.ok)
            c.print(f"[red bold]FAILED[/red bold]: {failed} ({result.elapsed_s:.1f} s)")


def _one_line(text: str, limit: int = 110) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def as_json(result: StoryResult, *, store: str, workspace: str, seed: int | None) -> dict[str, Any]:
    """The machine-readable account (``statekeel demo --json``)."""
    point = CRASH_POINTS[result.crash_at - 1]
    return {
        "ok": result.ok,
        "store": store,
        "workspace": workspace,
        "seed": seed,
        "crash_at": result.crash_at,
        "crash_points": len(CRASH_POINTS),
        "crash_label": point.label,
        "runs": [
            {
                "pid": run.pid,
                "killed_at": run.killed_at,
                "exit_code": run.returncode,
                "recovery": run.recovery,
                "resolved": [{k: r[k] for k in ("resolved", "outcome", "why")} for r in run.resolved],
            }
            for run in result.runs
        ],
        "effects": result.effects,
        "acknowledged": result.acknowledged,
        "checks": {check.name: check.ok for check in result.checks},
        "details": {check.name: check.detail for check in result.checks},
        "elapsed_s": round(result.elapsed_s, 3),
    }
