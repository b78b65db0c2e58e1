"""Both SQL dialects define the same named queries, each with the same parameters.

Every operation is written once over the ``Tx`` interface and runs a query by name with positional
arguments, so a query missing from one dialect, or taking another number of parameters there, fails only
on that backend. The queries are read from every ``*.sql`` file of each dialect package, so new files are
checked as they are added.
"""

from __future__ import annotations

import re

import pytest

from statekeel.backends.sql import load_queries
from statekeel.backends.sql.copy import TABLES, table_spec

SQLITE = load_queries("statekeel.backends.sqlite")
POSTGRES = load_queries("statekeel.backends.postgres")

# Comments and string literals may hold text that looks like a parameter; they are removed first.
_COMMENT_OR_STRING = re.compile(r"--[^\n]*|'(?:[^']|'')*'")
_SQLITE_PARAM = re.compile(r"\?(\d*)")
_POSTGRES_PARAM = re.compile(r"\$(\d+)")


def parameters(sql: str, pattern: re.Pattern[str]) -> set[int]:
    """The numbers of the distinct parameters ``sql`` uses (``?N`` or ``$N``)."""
    found = pattern.findall(_COMMENT_OR_STRING.sub("''", sql))
    assert all(found), f"an unnumbered '?' parameter in:\n{sql}"  # ?N only: arguments bind by position
    return {int(n) for n in found}


def test_both_dialects_define_the_same_query_names() -> None:
    assert SQLITE, "no SQLite queries were loaded"
    assert sorted(set(SQLITE) - set(POSTGRES)) == [], "defined for SQLite only"
    assert sorted(set(POSTGRES) - set(SQLITE)) == [], "defined for PostgreSQL only"


@pytest.mark.parametrize("name", sorted(set(SQLITE) | set(POSTGRES)))
def test_a_query_takes_the_same_parameters_in_both_dialects(name: str) -> None:
    assert name in SQLITE and name in POSTGRES, f"{name} is missing from one dialect"
    lite = parameters(SQLITE[name], _SQLITE_PARAM)
    pg = parameters(POSTGRES[name], _POSTGRES_PARAM)
    assert len(lite) == len(pg), f"{name}: {len(lite)} parameters in SQLite, {len(pg)} in PostgreSQL"
    assert lite == pg
    # Numbered from 1 without a gap: a skipped number is an argument no statement reads.
    assert lite == set(range(1, len(lite) + 1))


def test_parameters_are_found_past_comments_and_string_literals() -> None:
    sql = "SELECT '?9', '$9' -- ?8 $8\nFROM t WHERE a = ?1 AND b = ?2 AND c = 'it''s ?7'"
    assert parameters(sql, _SQLITE_PARAM) == {1, 2}
    assert parameters(sql.replace("?1", "$1").replace("?2", "$2"), _POSTGRES_PARAM) == {1, 2}


def _insert_columns(sql: str) -> list[str]:
    found = re.search(r"INSERT INTO \w+\s*\(([^)]*)\)", sql)
    assert found, f"no column list in:\n{sql}"
    return [c.strip() for c in found.group(1).split(",")]


@pytest.mark.parametrize("table", [t.name for t in TABLES])
def test_a_copy_insert_binds_one_parameter_per_column_of_its_table(table: str) -> None:
    # copy_store hands import_rows rows as wide as the table's column list: an insert naming other
    # columns, or binding another number of parameters, fails on the first row of that table only.
    columns = [c for c, _ in table_spec(table).columns]
    for queries, pattern in ((SQLITE, _SQLITE_PARAM), (POSTGRES, _POSTGRES_PARAM)):
        sql = queries[f"copy_{table}_insert"]
        assert _insert_columns(sql) == columns
        assert parameters(sql, pattern) == set(range(1, len(columns) + 1))
