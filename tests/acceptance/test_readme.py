"""The README's tour runs as written (on a store in a temporary directory)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _tour() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) >= 2, "the README tour lost its python blocks"
    first, second = blocks[0], blocks[1]
    # The second block continues inside the first block's `async with`.
    return first + textwrap.indent(second, "    ")


async def test_readme_tour_runs_as_written(tmp_path: Path) -> None:
    code = _tour().replace("sqlite:///agent-state.db", f"sqlite:///{tmp_path / 'agent-state.db'}")
    applied: list[str] = []
    namespace: dict[str, object] = {"apply_patch": lambda name: applied.append(name) or name}
    exec(compile("async def tour():\n" + textwrap.indent(code, "    "), "README.md", "exec"), namespace)
    await namespace["tour"]()  # type: ignore[operator]
    assert applied == ["fix.diff"]
