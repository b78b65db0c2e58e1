"""The PostgreSQL schema keeps to the sharding rules of docs/scale.md (read from the migrations).

docs/scale.md places every table (distributed by a column, reference, or single shard), lists the
constraints that cross shards with their fallback, and the triggers, advisory locks and row locks statekeel
uses. These tests parse that page and the migration files, and fail when a migration adds a table, a
foreign key, a unique constraint, a trigger or a lock that the page does not account for — or when the
page names something the schema no longer has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PG = REPO / "src" / "statekeel" / "backends" / "postgres"
DOC = REPO / "docs" / "scale.md"


@dataclass
class Table:
    name: str
    columns: list[str] = field(default_factory=list)
    primary_key: list[str] = field(default_factory=list)
    # (local columns, target table, target columns)
    foreign_keys: list[tuple[list[str], str, list[str]]] = field(default_factory=list)
    uniques: list[list[str]] = field(default_factory=list)


def _split_top_level(body: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in body:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [re.sub(r"--[^\n]*", "", p).strip() for p in parts if p.strip()]


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",")]


def _schema() -> tuple[dict[str, Table], list[str]]:
    """The tables the migrations create (with later ADD COLUMNs) and every statement's text."""
    tables: dict[str, Table] = {}
    texts: list[str] = []
    for path in sorted((PG / "migrations").glob("*.sql")):
        sql = re.sub(r"--[^\n]*", "", path.read_text())
        texts.append(sql)
        for m in re.finditer(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+) \((.*?)\n\);", sql, re.S):
            t = Table(m.group(1))
            for item in _split_top_level(m.group(2)):
                head = item.split()[0].upper()
                if head == "PRIMARY":
                    t.primary_key = _names(re.search(r"\((.*?)\)", item).group(1))  # type: ignore[union-attr]
                elif head == "FOREIGN":
                    fk = re.search(r"FOREIGN KEY \((.*?)\) REFERENCES (\w+) \((.*?)\)", item)
                    assert fk, item
                    t.foreign_keys.append((_names(fk.group(1)), fk.group(2), _names(fk.group(3))))
                elif head == "UNIQUE":
                    t.uniques.append(_names(re.search(r"\((.*?)\)", item).group(1)))  # type: ignore[union-attr]
                elif head in ("CHECK", "CONSTRAINT", "EXCLUDE"):
                    assert "UNIQUE" not in item and "FOREIGN" not in item, item
                else:
                    col = item.split()[0]
                    t.columns.append(col)
                    if "PRIMARY KEY" in item:
                        t.primary_key = [col]
                    if re.search(r"\bUNIQUE\b", item):
                        t.uniques.append([col])
                    ref = re.search(r"REFERENCES (\w+) \((\w+)\)", item)
                    if ref:
                        t.foreign_keys.append(([col], ref.group(1), [ref.group(2)]))
            tables[t.name] = t
        for m in re.finditer(r"ALTER TABLE (\w+) ADD COLUMN (\w+)", sql):
            tables[m.group(1)].columns.append(m.group(2))
        for m in re.finditer(r"CREATE UNIQUE INDEX (\w+) ON (\w+) \((.*?)\)", sql):
            tables[m.group(2)].uniques.append(_names(m.group(3)))
    return tables, texts


def _doc_table(header: str) -> list[list[str]]:
    """The rows of the markdown table in docs/scale.md whose header row starts with ``header``."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _placements() -> dict[str, tuple[str, str | None]]:
    out: dict[str, tuple[str, str | None]] = {}
    for table, placement, column in _doc_table("table"):
        name = _ticked(table)[0]
        assert placement in ("distributed", "reference", "single shard"), placement
        out[name] = (placement, _ticked(column)[0] if placement == "distributed" else None)
    return out


def _exceptions(tables: dict[str, Table]) -> set[str]:
    """``table.column`` of every constraint listed under exceptions; ``table.a+b+c`` for a unique key of
    several columns (its cell names the table, then the columns)."""
    found: set[str] = set()
    for constraint, _fallback in _doc_table("constraint"):
        first, *rest = _ticked(constraint)
        if "." in first:
            table = first.split(".")[0]
            found.add(first)
            found.update(f"{table}.{c}" for c in rest if c in tables[table].columns)
        else:
            found.add(f"{first}.{'+'.join(rest)}")
    return found


TABLES, TEXTS = _schema()
PLACEMENTS = _placements()
EXCEPTIONS = _exceptions(TABLES)


def test_every_table_of_the_migrations_is_placed_in_the_doc_and_no_other() -> None:
    assert len(TABLES) > 20  # the parser found the schema
    assert sorted(TABLES) == sorted(PLACEMENTS)


@pytest.mark.parametrize("name", sorted(t for t, (p, _) in PLACEMENTS.items() if p == "distributed"))
def test_distributed_table_has_its_key_first_in_the_primary_key(name: str) -> None:
    column = PLACEMENTS[name][1]
    table = TABLES[name]
    assert column in table.columns, f"{name} has no column {column}"
    assert table.primary_key and table.primary_key[0] == column, (name, table.primary_key)


def _colocated(name: str, local: list[str], target: str, remote: list[str]) -> bool:
    placement, column = PLACEMENTS[name]
    target_placement, target_column = PLACEMENTS[target]
    if target_placement == "reference":
        return True
    if placement == "single shard" and target_placement == "single shard":
        return True
    return bool(local and remote and local[0] == column and remote[0] == target_column)


def test_every_foreign_key_is_colocated_or_goes_to_a_reference_table_or_is_an_exception() -> None:
    offending = []
    for table in TABLES.values():
        for local, target, remote in table.foreign_keys:
            if (
                not _colocated(table.name, local, target, remote)
                and f"{table.name}.{local[0]}" not in EXCEPTIONS
            ):
                offending.append(f"{table.name}.{','.join(local)} -> {target}")
    assert not offending, f"foreign keys across shards missing from docs/scale.md's exceptions: {offending}"


def test_every_unique_constraint_includes_the_distribution_column_or_is_an_exception() -> None:
    offending = []
    for table in TABLES.values():
        placement, column = PLACEMENTS[table.name]
        if placement != "distributed":
            continue
        for unique in table.uniques:
            listed = f"{table.name}.{'+'.join(unique)}" in EXCEPTIONS or (
                len(unique) == 1 and f"{table.name}.{unique[0]}" in EXCEPTIONS
            )
            if column not in unique and not listed:
                offending.append(f"{table.name} ({', '.join(unique)})")
    assert not offending, f"unique constraints across shards missing from the exceptions: {offending}"


def test_exceptions_name_constraints_the_schema_has() -> None:
    known = {f"{t.name}.{fk[0][0]}" for t in TABLES.values() for fk in t.foreign_keys}
    known |= {f"{t.name}.{'+'.join(u)}" for t in TABLES.values() for u in t.uniques}
    assert known >= EXCEPTIONS, EXCEPTIONS - known


def _feature_row(feature: str) -> list[str]:
    return next(row for row in _doc_table("feature") if row[0].startswith(feature))


def test_triggers_are_exactly_the_documented_append_only_guards() -> None:
    created = {m for text in TEXTS for m in re.findall(r"CREATE TRIGGER (\w+)", text)}
    assert created, "the parser found no trigger"
    assert created == set(_ticked(_feature_row("triggers")[1]))


def _without_comments(path: Path) -> str:
    return re.sub(r"--[^\n]*", "", path.read_text())


def _sources() -> dict[str, str]:
    files = [
        *PG.glob("*.sql"),
        *PG.glob("*.py"),
        *(REPO / "src" / "statekeel" / "backends" / "sql").glob("*.py"),
    ]
    # Without comments and docstrings: what is left is code and the SQL it sends.
    return {p.name: re.sub(r'"""[\s\S]*?"""|(--|#)[^\n]*', "", p.read_text()) for p in files}


def test_advisory_locks_are_taken_only_where_the_doc_says() -> None:
    using = {name for name, text in _sources().items() if "pg_advisory" in text}
    # A migration may install a function that takes one (the audit chain's lock and head in one call).
    using |= {p.name for p in (PG / "migrations").glob("*.sql") if "pg_advisory" in _without_comments(p)}
    assert using == set(_ticked(_feature_row("advisory locks")[1]))


def test_row_locks_are_taken_only_where_the_doc_says() -> None:
    sources = _sources()
    skip_locked = {name for name, text in sources.items() if "SKIP LOCKED" in text}
    by_key = {name for name, text in sources.items() if "FOR UPDATE" in text} - skip_locked
    assert skip_locked == set(_ticked(_feature_row("`FOR UPDATE SKIP LOCKED`")[1])) - {
        "FOR UPDATE SKIP LOCKED"
    }
    assert by_key == set(_ticked(_feature_row("`FOR UPDATE` on one row")[1])) - {"FOR UPDATE"}


def test_no_listen_or_notify_anywhere_in_the_postgres_backend() -> None:
    # A statement (``LISTEN channel``, ``NOTIFY channel``), pg_notify(), or asyncpg's add_listener.
    use = re.compile(r"\b(LISTEN|NOTIFY)\s+[\w\"]|pg_notify|add_listener")
    for name, text in _sources().items():
        assert not use.search(text), name
    for text in TEXTS:
        assert not use.search(text)
