"""What a release is made of: the wheel carries every file the package reads, and the version in
pyproject.toml is the one CHANGELOG.md's top section names (the rule in docs/contributing.md)."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import statekeel

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "statekeel"


def _config() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_file_the_package_holds_besides_python_is_in_its_package_data() -> None:
    globs = _config()["tool"]["setuptools"]["package-data"]["statekeel"]  # type: ignore[index]
    data = [
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    ]
    assert data, "the package holds SQL files, templates and styles"
    missing = [name for name in data if not any(fnmatch.fnmatchcase(name, glob) for glob in globs)]
    assert missing == [], f"add these to [tool.setuptools.package-data] in pyproject.toml: {missing}"


def test_the_version_is_the_one_the_changelogs_top_section_names() -> None:
    version = _config()["project"]["version"]  # type: ignore[index]
    headings = re.findall(r"^## \[([^\]]+)\](.*)$", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert headings, "CHANGELOG.md has no '## [X.Y.Z] - YYYY-MM-DD' (or '- unreleased') section"
    top, rest = headings[0]
    assert top == version, f"pyproject.toml says {version}, CHANGELOG.md's top section {top}"
    assert re.fullmatch(r" - (unreleased|\d{4}-\d{2}-\d{2})", rest), f"'## [{top}]{rest}': date or unreleased"
    assert statekeel.__version__ == version
