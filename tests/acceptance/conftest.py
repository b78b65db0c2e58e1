"""Stores the command-line tests run ``statekeel`` against: the prepared store of every kind of state
(``helpers.fill_ui_store``), on SQLite and on PostgreSQL, one copy per test."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from helpers import Prepared


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def filled(request: pytest.FixtureRequest, tmp_path: Path) -> Prepared:
    """A store holding every kind of state (a tampered audit entry, a tool call without a result, an
    expired lease …) that this test may change: a copy of the prepared SQLite file, or a fresh PostgreSQL
    database."""
    if request.param == "postgres":
        prepared_pg: Prepared = request.getfixturevalue("prepared_pg")
        return prepared_pg
    prepared: Prepared = request.getfixturevalue("prepared")
    path = tmp_path / "agent-state.db"
    shutil.copyfile(prepared.path, path)  # closed: everything is in the file
    return dataclasses.replace(prepared, path=path, url=f"sqlite:///{path}")
