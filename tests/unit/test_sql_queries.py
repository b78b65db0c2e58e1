"""The SQL dialects define the same named queries, each with the same parameters.

Every operation is written once over the ``Tx`` interface and runs a query by name with positional
arguments, so a query missing from one dialect, or taking another number of parameters there, fails only
on that backend. The queries are read from every ``*.sql`` file of each dialect package, so new files are
checked as they are added.
"""

from __future__ import annotations

import re

import pytest

from statekeel.backends.sql import load_queries, segments
from statekeel.backends.sql.copy import TABLES, table_spec

SQLITE = load_queries("statekeel.backends.sqlite")
POSTGRES = load_queries("statekeel.backends.postgres")
MYSQL = load_queries("statekeel.backends.mysql")

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
    # Sealed segments are SQLite's alone (its Tx sets ``segments``); every other name is in both.
    assert sorted(set(SQLITE) - set(POSTGRES)) == sorted(segments.QUERIES), "defined for SQLite only"
    assert sorted(set(POSTGRES) - set(SQLITE)) == [], "defined for PostgreSQL only"


def test_the_mysql_dialect_defines_the_same_query_names() -> None:
    assert sorted(set(POSTGRES) - set(MYSQL)) == [], "missing from the MySQL/MariaDB dialect"
    assert sorted(set(MYSQL) - set(POSTGRES)) == [], "defined for MySQL/MariaDB only"


def _bound_by_selects(name: str, given: int) -> int:
    """How many parameters the non-final SELECTs of a MySQL script bind (after the caller's)."""
    from statekeel.backends.mysql.queries import compile_query

    script = compile_query(name, MYSQL[name])
    bound = 0
    for st in script.statements[:-1]:
        if st.selects:
            select_list = st.text.split(" FROM ", 1)[0]
            bound += len(select_list.split(","))
    assert all(i < given + bound for st in script.statements for i in st.order)
    return bound


@pytest.mark.parametrize("name", sorted(set(POSTGRES) | set(MYSQL)))
def test_a_query_takes_the_same_parameters_in_the_mysql_dialect(name: str) -> None:
    assert name in POSTGRES and name in MYSQL, f"{name} is missing from one dialect"
    pg = parameters(POSTGRES[name], _POSTGRES_PARAM)
    my = parameters(MYSQL[name], _POSTGRES_PARAM)
    # The caller's parameters are the same; a script's later statements may also use the columns its
    # SELECTs found (numbered after the caller's), e.g. the id a claim locked.
    assert {n for n in my if n <= len(pg)} == pg, f"{name}: another set of parameters than PostgreSQL's"
    extra = {n for n in my if n > len(pg)}
    assert extra == set(range(len(pg) + 1, len(pg) + 1 + len(extra)))
    assert len(extra) <= _bound_by_selects(name, len(pg)), f"{name}: a parameter no caller or SELECT binds"


@pytest.mark.parametrize("name", sorted((set(SQLITE) | set(POSTGRES)) - segments.QUERIES))
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
    return [c.strip().strip("`") for c in found.group(1).split(",")]  # MySQL quotes `key`


@pytest.mark.parametrize("table", [t.name for t in TABLES])
def test_a_copy_insert_binds_one_parameter_per_column_of_its_table(table: str) -> None:
    # copy_store hands import_rows rows as wide as the table's column list: an insert naming other
    # columns, or binding another number of parameters, fails on the first row of that table only.
    columns = [c for c, _ in table_spec(table).columns]
    for queries, pattern in ((SQLITE, _SQLITE_PARAM), (POSTGRES, _POSTGRES_PARAM), (MYSQL, _POSTGRES_PARAM)):
        sql = queries[f"copy_{table}_insert"]
        assert _insert_columns(sql) == columns
        assert parameters(sql, pattern) == set(range(1, len(columns) + 1))
