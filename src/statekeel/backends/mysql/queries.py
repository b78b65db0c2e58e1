"""The MySQL dialect's named queries: numbered parameters compiled to the driver's positional ``%s``.

The ``.sql`` files of this dialect use the numbered parameters of the other dialects (``$1``, ``$2`` …), so a
query takes the same arguments everywhere. At load time each statement becomes the driver's ``%s`` form with
the argument order it needs (a number used twice is bound twice); values are always bound by the driver,
never written into the SQL.

MariaDB has no ``UPDATE … RETURNING``, so a named query may be a short script: statements separated by a
``;``, run in order in the caller's transaction, with these rules:

- a data-changing statement (not the last) that changes no row ends the script with no rows — the
  ``RETURNING`` of a conditional update that did not apply;
- a ``SELECT`` (not the last) that finds no row ends the script with no rows; the columns of the row it
  finds become the next parameters (``$N+1`` …, after the caller's N), and when it finds several rows the
  rest of the script runs once per row, the results in that order;
- a statement after an ``-- otherwise`` line runs only when the data-changing statement before it changed
  no row (an insert that met a duplicate: ``ON CONFLICT … DO UPDATE … WHERE``), and then its count is the
  query's; when that statement did change a row, it is skipped;
- a statement carrying ``-- on duplicate KEYNAME …`` (or ``-- on duplicate any``) counts a duplicate-key
  error on that unique key as "no row changed" — ``ON CONFLICT DO NOTHING``. InnoDB rolls back only the
  failed statement, so the transaction goes on.

A ``LIMIT $n`` given None means no limit (PostgreSQL's ``LIMIT NULL``): the driver gets the largest limit.

The rows of the last statement are the query's rows; its row count is the count of its first data-changing
statement (summed over the rows it ran for).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..sql import load_queries

# A string literal, a comment, a numbered parameter, a percent sign (doubled for the driver's formatting),
# or a statement-ending semicolon.
_TOKEN = re.compile(r"'(?:[^'\\]|''|\\.)*'|--[^\n]*|\$(\d+)|%|;", re.DOTALL)
_DIRECTIVE = re.compile(r"--\s*on duplicate\s+([\w ]+?)\s*$", re.MULTILINE)
_OTHERWISE = re.compile(r"^\s*--\s*otherwise\s*$", re.MULTILINE)
_LIMIT = re.compile(r"\bLIMIT\s+$", re.IGNORECASE)
_MODIFYING = ("INSERT", "UPDATE", "DELETE", "REPLACE")


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement of a named query, in the driver's form."""

    text: str  # with %s placeholders
    order: tuple[int, ...]  # the 0-based argument index of each placeholder
    modifies: bool
    selects: bool
    duplicate_ok: frozenset[str] | None  # unique keys whose duplicate means "no row"; {"any"}: every key
    otherwise: bool = False  # runs only when the statement before it changed no row
    limits: tuple[int, ...] = ()  # placeholders that are a LIMIT: NULL there means "no limit"


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    statements: tuple[Statement, ...]

    @property
    def simple(self) -> Statement | None:
        """The statement of a one-statement query without directives (the common, fast path)."""
        if len(self.statements) == 1 and self.statements[0].duplicate_ok is None:
            return self.statements[0]
        return None


def compile_statement(sql: str) -> Statement:
    keys = _DIRECTIVE.findall(sql)
    duplicate_ok = frozenset(k for found in keys for k in found.split()) if keys else None
    out: list[str] = []
    order: list[int] = []
    limits: list[int] = []
    pos = 0
    for m in _TOKEN.finditer(sql):
        out.append(sql[pos : m.start()])
        token = m.group(0)
        if m.group(1) is not None:
            if _LIMIT.search(sql[max(0, m.start() - 12) : m.start()]):
                limits.append(len(order))
            out.append("%s")
            order.append(int(m.group(1)) - 1)
        elif token == "%":
            out.append("%%")
        elif token.startswith("--"):
            pass  # comments are not sent
        elif token.startswith("'"):
            out.append(token.replace("%", "%%"))
        else:
            raise ValueError(f"a ';' inside a statement: {sql!r}")
        pos = m.end()
    out.append(sql[pos:])
    text = " ".join("".join(out).split())
    verb = text.split(" ", 1)[0].upper()
    return Statement(
        text=text,
        order=tuple(order),
        modifies=verb in _MODIFYING,
        selects=verb in ("SELECT", "WITH"),
        duplicate_ok=duplicate_ok,
        otherwise=bool(_OTHERWISE.search(sql)),
        limits=tuple(limits),
    )


def split_statements(sql: str) -> list[str]:
    """The statements of a query body, split at each ``;`` outside literals and comments."""
    parts: list[str] = []
    pos = 0
    for m in _TOKEN.finditer(sql):
        if m.group(0).startswith(";"):
            parts.append(sql[pos : m.start()])
            pos = m.end()
    parts.append(sql[pos:])
    return [p for p in parts if _TOKEN.sub(lambda m: "" if m.group(0).startswith("--") else "x", p).strip()]


def compile_query(name: str, sql: str) -> Script:
    return Script(name, tuple(compile_statement(s) for s in split_statements(sql)))


def load_scripts(package: str) -> dict[str, Script]:
    """Every named query of ``package`` compiled (see the module docstring)."""
    return {name: compile_query(name, sql) for name, sql in load_queries(package).items()}
