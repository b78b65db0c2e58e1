"""docs/api/index.md is generated from the docstrings of every public name and is up to date."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

import statekeel

ROOT = Path(__file__).parent.parent.parent
REFERENCE = ROOT / "docs" / "api" / "index.md"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("api_reference", ROOT / "tools" / "api_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("api_reference", module)
    spec.loader.exec_module(module)
    return module


def test_every_public_name_and_its_public_methods_have_a_docstring() -> None:
    assert generator().missing_docstrings() == []


def test_the_api_reference_is_up_to_date_with_the_docstrings() -> None:
    assert REFERENCE.read_text() == generator().render(), (
        "docs/api/index.md is out of date: python tools/api_reference.py > docs/api/index.md"
    )


def test_the_api_reference_documents_every_exported_name() -> None:
    text = REFERENCE.read_text()
    for name in statekeel.__all__:
        assert f"\n## `{name}`\n" in text, name


def test_the_generator_finds_a_public_name_without_docstring(monkeypatch: pytest.MonkeyPatch) -> None:
    module = generator()

    def undocumented() -> None:
        pass

    monkeypatch.setattr(statekeel, "undocumented", undocumented, raising=False)
    monkeypatch.setattr(statekeel, "__all__", [*statekeel.__all__, "undocumented"])
    assert module.missing_docstrings() == ["undocumented"]
