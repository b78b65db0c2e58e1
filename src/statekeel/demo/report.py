"""The demo's human-readable account (rich; plain text when there is no terminal)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..wording import counted
from .runner import DemoResult


def render(console: Console, result: DemoResult, *, where: str) -> None:
    """Print what happened: the writer runs, the kills, and the verdict per session."""
    # Never wrapped: the URL is copied from here into the next command.
    console.print(f"[bold]statekeel demo[/bold] — store: {escape(where)}", soft_wrap=True)
    for n, cycle in enumerate(result.cycles, start=1):
        how = (
            f"killed with SIGKILL {cycle.kill_after_s:.2f} s after it started writing"
            if cycle.killed
            else f"exited by itself (code {cycle.returncode})"
        )
        console.print(
            f"  run {n}: writer pid {cycle.pid} acknowledged {counted(cycle.acknowledged, 'message')} "
            f"({counted(cycle.acknowledged // 4, 'turn')}), then was {how}."
        )
    v = result.verification
    table = Table(title="after reopening the store", title_justify="left", show_edge=False)
    table.add_column("session")
    table.add_column("acknowledged", justify="right")
    table.add_column("stored", justify="right")
    table.add_column("verdict")
    for s in v.sessions:
        table.add_row(
            escape(s.key), str(s.acknowledged), str(s.stored), "ok" if s.ok else "[red]FAILED[/red]"
        )
    if v.sessions:
        console.print(table)
    extra = v.stored - v.acknowledged
    if v.ok:
        console.print(
            f"[green]verified[/green]: {'the' if v.acknowledged == 1 else 'all'} "
            f"{counted(v.acknowledged, 'acknowledged message')} survived the kill, "
            "in order, "
            f"with dense sequence numbers and the exact content written ({result.verify_s * 1000:.0f} ms). "
            f"{extra} more {'was' if extra == 1 else 'were'} committed just before the kill without being "
            "acknowledged. "
            "integrity_check: ok."
        )
        return
    console.print("[red bold]verification FAILED[/red bold]:")
    for problem in v.all_problems():
        console.print(f"  - {problem}", markup=False)
