"""The SQL dialects define the same named queries, each with the same parameters, but for the ones a
dialect has no use for (``NOT_NEEDED``, each with its reason): those it must not define.

Every operation is written once over the ``Tx`` interface and runs a query by name with positional
arguments, so a query missing from one dialect, or taking another number of parameters there, fails only
on that backend. The queries are read from every ``*.sql`` file of each dialect package, so new files are
checked as they are added.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from statekeel.backends.sql import load_queries, segments
from statekeel.backends.sql.copy import TABLES, table_spec

SQLITE = load_queries("statekeel.backends.sqlite")
POSTGRES = load_queries("statekeel.backends.postgres")
MYSQL = load_queries("statekeel.backends.mysql")
BACKENDS = Path(__file__).resolve().parents[2] / "src" / "statekeel" / "backends"

# The save in one statement (backends/sql/save.py): only PostgreSQL runs it, where each statement is a
# network round trip.
ONE_STATEMENT_SAVE = frozenset({"session_save"})
_ONE_STATEMENT_SAVE_UNUSED = (
    "saves with session_advance_head and message_insert (its writer's connection, no round trip a statement)"
)
_SEGMENTS_UNUSED = "keeps no sealed segments (only SQLite's Tx sets segments: a load there costs per row)"
# The named queries a dialect does not define, and why it needs none. Every other name is in all three.
NOT_NEEDED: dict[str, dict[str, str]] = {
    "sqlite": dict.fromkeys(ONE_STATEMENT_SAVE, _ONE_STATEMENT_SAVE_UNUSED),
    "postgres": dict.fromkeys(segments.QUERIES, _SEGMENTS_UNUSED),
    "mysql": {
        **dict.fromkeys(segments.QUERIES, _SEGMENTS_UNUSED),
        # MySQL's driver sends the messages' rows as one multi-row INSERT already.
        **dict.fromkeys(ONE_STATEMENT_SAVE, _ONE_STATEMENT_SAVE_UNUSED),
    },
}
DIALECTS = {"sqlite": SQLITE, "postgres": POSTGRES, "mysql": MYSQL}
EVERY_NAME = sorted(set(SQLITE) | set(POSTGRES) | set(MYSQL))


def needed(dialect: str) -> set[str]:
    return set(EVERY_NAME) - set(NOT_NEEDED[dialect])


# Comments and string literals may hold text that looks like a parameter; they are removed first.
_COMMENT_OR_STRING = re.compile(r"--[^\n]*|'(?:[^']|'')*'")
_SQLITE_PARAM = re.compile(r"\?(\d*)")
_POSTGRES_PARAM = re.compile(r"\$(\d+)")


def parameters(sql: str, pattern: re.Pattern[str]) -> set[int]:
    """The numbers of the distinct parameters ``sql`` uses (``?N`` or ``$N``)."""
    found = pattern.findall(_COMMENT_OR_STRING.sub("''", sql))
    assert all(found), f"an unnumbered '?' parameter in:\n{sql}"  # ?N only: arguments bind by position
    return {int(n) for n in found}


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_a_dialect_defines_every_query_name_but_the_ones_it_does_not_need(dialect: str) -> None:
    queries = DIALECTS[dialect]
    assert queries, f"no {dialect} queries were loaded"
    assert sorted(needed(dialect) - set(queries)) == [], f"missing from the {dialect} dialect"
    # A query a dialect never runs is not kept there to make the sets match.
    assert sorted(set(queries) & set(NOT_NEEDED[dialect])) == [], f"defined for {dialect}, never run there"


def test_only_a_dialect_that_defines_the_one_statement_save_runs_it() -> None:
    runs = {
        dialect
        for dialect in DIALECTS
        if any("op_save_in_one_statement" in p.read_text() for p in (BACKENDS / dialect).glob("*.py"))
    }
    assert runs == {d for d in DIALECTS if set(DIALECTS[d]) >= ONE_STATEMENT_SAVE} == {"postgres"}


def test_segments_are_the_only_queries_sqlite_alone_defines() -> None:
    assert set(SQLITE) - set(POSTGRES) - set(MYSQL) == segments.QUERIES


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


@pytest.mark.parametrize("name", sorted(needed("postgres") & needed("mysql")))
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


@pytest.mark.parametrize("name", sorted(needed("sqlite") & needed("postgres")))
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
