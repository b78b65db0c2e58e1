"""The module map of docs/architecture.md, written from the code: ``python tools/architecture_map.py``.

Every module under ``src/statekeel`` gets one row: its path and the first sentence of its docstring (read
with ``ast``, nothing imported). The rows replace what lies between the two markers in
docs/architecture.md; ``--check`` writes nothing and exits 1 when the page is stale. A module without a
docstring is an error: the map would have a hole where the code has no word for what a module is.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "statekeel"
PAGE = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- module map: written by tools/architecture_map.py from the docstrings; do not edit by hand -->"
END = "<!-- end of the module map -->"

# Sphinx roles (:class:`~x.Y`) and reST literals (``x``) as Markdown code.
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(])")


def _markdown(text: str) -> str:
    return _ROLE.sub(r"`\1`", text).replace("``", "`").replace("|", "\\|")


def first_sentence(docstring: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line."""
    paragraph = " ".join(docstring.strip().split("\n\n")[0].split())
    return _SENTENCE_END.split(paragraph, maxsplit=1)[0]


def _sort_key(path: Path) -> tuple[str, ...]:
    # A package's __init__.py first, the rest by path.
    parts = path.relative_to(PACKAGE).parts
    return (*parts[:-1], "" if parts[-1] == "__init__.py" else parts[-1])


def rows() -> list[tuple[str, str]]:
    """``(path inside src/statekeel, first sentence)`` for every module; ``SystemExit`` naming those
    without a docstring."""
    found, missing = [], []
    for path in sorted(PACKAGE.rglob("*.py"), key=_sort_key):
        name = path.relative_to(PACKAGE).as_posix()
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        if not docstring:
            missing.append(name)
        else:
            found.append((name, _markdown(first_sentence(docstring))))
    if missing:
        raise SystemExit(f"modules without a docstring (the map needs one line each): {', '.join(missing)}")
    return found


def render_map() -> str:
    lines = [BEGIN, "", "| module (under `src/statekeel/`) | what it is |", "|---|---|"]
    lines += [f"| `{name}` | {line} |" for name, line in rows()]
    return "\n".join([*lines, "", END])


def render(page: str) -> str:
    """``page`` with its module map replaced by one written from the code now."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{PAGE.name} has no module map between {BEGIN!r} and {END!r}")
    return page[:start] + render_map() + page[end + len(END) :]


def main(argv: list[str]) -> int:
    page = PAGE.read_text(encoding="utf-8")
    fresh = render(page)
    if "--check" in argv:
        if fresh != page:
            print("docs/architecture.md's module map is stale: run python tools/architecture_map.py")
            return 1
        return 0
    PAGE.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
