"""docs/architecture.md's module map is the code's: one row per module under src/statekeel, each the first
sentence of the module's docstring, rewritten by tools/architecture_map.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("architecture_map", ROOT / "tools" / "architecture_map.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("architecture_map", module)
    spec.loader.exec_module(module)
    return module


def test_the_module_map_is_up_to_date_with_the_docstrings() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert generator().render(page) == page, (
        "docs/architecture.md's module map is stale: python tools/architecture_map.py"
    )


def test_the_map_has_a_row_for_every_module_and_no_other() -> None:
    tool = generator()
    page = PAGE.read_text(encoding="utf-8")
    section = page[page.index(tool.BEGIN) : page.index(tool.END)]
    mapped = {line.split("`")[1] for line in section.splitlines() if line.startswith("| `")}
    package = ROOT / "src" / "statekeel"
    modules = {path.relative_to(package).as_posix() for path in package.rglob("*.py")}
    assert mapped == modules
    assert {"tasks/manager.py", "codec/keyring.py", "cli/group.py"} <= mapped


def test_a_row_is_the_first_sentence_of_the_docstring_in_markdown() -> None:
    tool = generator()
    text = "The ``x`` of :class:`~statekeel.Store`. Then more.\nStill more.\n\nAnother paragraph."
    assert tool._markdown(tool.first_sentence(text)) == "The `x` of `statekeel.Store`."
    assert tool.first_sentence("One line, no stop") == "One line, no stop"
