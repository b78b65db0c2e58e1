"""Which rows of a damaged SQLite file can still be read, and which cannot.

``PRAGMA integrity_check`` says *that* pages are damaged (and often gives up with "database disk image is
malformed"); a person deciding what to restore needs to know *which records* are gone. For each table the
check finds damaged, the rows are read again in ways that route around the bad pages:

- a table whose rows all read has only a damaged index: ``REINDEX`` rebuilds it, nothing is lost;
- a rowid table is walked in rowid order; at a damaged page the walk probes further and further ahead
  until a read succeeds again, so the unreadable stretch of rowids is known; the keys in it come from the
  table's primary-key index when that still reads (an ``INTEGER PRIMARY KEY`` is the rowid itself);
- a ``WITHOUT ROWID`` table (messages, steps) is read per value of its first key column, taken from the
  parent table its foreign key names (a session, a task); a damaged group is narrowed to single rows when
  the second key column is an integer (a message's ``seq``).

Every read is an ordinary query: nothing is written. :func:`rebuild_into` writes a new file whose
indexes are built from the rows (for an index whose pages are too damaged to be rebuilt in place).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..base import Damage

_BATCH = 256
_MAX_ROWID = 2**63 - 1
# A stretch of unreadable integer keys is listed key by key up to this many; longer, it is reported as
# a range with an unknown number of rows.
_MAX_LISTED = 100_000


def _q(name: str) -> str:
    """A quoted SQL identifier (names come from sqlite_master, never from a caller)."""
    return '"' + name.replace('"', '""') + '"'


def _reads(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...] = ()) -> list[Any] | None:
    """All rows of a query, or None when a damaged page stops it."""
    cursor = conn.cursor()
    try:
        return cursor.execute(sql, args).fetchall()
    except sqlite3.DatabaseError:
        return None
    finally:
        cursor.close()  # resets a statement stopped by an error, so the transaction can still end


def table_problems(conn: sqlite3.Connection, table: str) -> list[str]:
    """What ``PRAGMA integrity_check(table)`` finds in a table and its indexes (empty when sound)."""
    rows = _reads(conn, f"PRAGMA integrity_check({_q(table)})")
    if rows is None:
        return ["the integrity check stopped at a damaged page (database disk image is malformed)"]
    found = [str(r[0]) for r in rows]
    return [] if found == ["ok"] else found


def scan(conn: sqlite3.Connection) -> list[Damage]:
    """The damage of every table of the database on ``conn`` (run inside a read transaction)."""
    tables = [
        (r[0], str(r[1] or ""))
        for r in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY name"
        )
    ]
    found: list[Damage] = []
    for table, sql in tables:
        problems = table_problems(conn, table)
        if problems:
            found.append(_table_damage(conn, table, "WITHOUT ROWID" in sql.upper(), problems))
    return found


def _table_damage(conn: sqlite3.Connection, table: str, without_rowid: bool, problems: list[str]) -> Damage:
    detail = "; ".join(problems)[:2000]
    count = _count_full_scan(conn, table)
    if count is not None:
        return Damage(table, True, (), count, True, detail)
    keys = _pk_columns(conn, table)
    if without_rowid:
        readable, unreadable, complete = _scan_by_parent(conn, table, keys)
    else:
        readable, unreadable, complete = _scan_by_rowid(conn, table, keys)
    return Damage(table, False, tuple(unreadable), readable, complete, detail)


def _count_full_scan(conn: sqlite3.Connection, table: str) -> int | None:
    """Rows of ``table`` when every row reads in full (overflow pages too), else None."""
    cursor = conn.cursor()
    try:
        n = 0
        for _ in cursor.execute(f"SELECT * FROM {_q(table)}"):
            n += 1
    except sqlite3.DatabaseError:
        return None
    finally:
        cursor.close()
    return n


def _pk_columns(conn: sqlite3.Connection, table: str) -> list[tuple[str, str]]:
    """``(name, declared type)`` of the primary key columns, in key order."""
    info = conn.execute(f"PRAGMA table_info({_q(table)})").fetchall()
    keyed = sorted((r[5], r[1], str(r[2]).upper()) for r in info if r[5])
    return [(name, kind) for _, name, kind in keyed]


# --- walking past damaged pages ---------------------------------------------------------------------

Rows = list[Any] | None  # what a query read, None when a damaged page stopped it
Candidates = Callable[[int, int | None], Iterable[int] | None]


def _walk(
    batch: Callable[[int], Rows],
    one: Callable[[int], Rows],
    seek: Callable[[int], Rows],
    point: Callable[[int], Rows],
    candidates: Candidates,
) -> Iterator[tuple[int | None, bool]]:
    """Walk integer keys in order: ``(key, True)`` per row that reads, ``(key, False)`` per key whose row
    does not, ``(None, False)`` once for a damaged stretch whose keys cannot be named.

    ``batch``/``one`` read up to 256 / one whole row(s) with a key after the given one (first column the
    key); ``seek`` reads only the next key; ``point`` reads the row of one key; ``candidates(after, last)``
    lists the keys to try in a damaged stretch ``(after, last]`` (``last`` None: to the end), or None when
    they cannot be listed.
    """
    after = -1  # statekeel's integer keys (rowids, seqs) start at 0 or 1
    while True:
        rows = batch(after)
        if rows is not None:
            if not rows:
                return
            for row in rows:
                yield row[0], True
            after = rows[-1][0]
            continue
        rows = one(after)
        while rows:  # row by row up to the damage
            yield rows[0][0], True
            after = rows[0][0]
            rows = one(after)
        if rows is not None:
            return
        nxt = seek(after)
        if nxt:  # the next key reads but its row does not (e.g. a damaged overflow page)
            yield nxt[0][0], False
            after = nxt[0][0]
            continue
        resume = _resume_after(lambda x: seek(x) is not None, after)
        keys = candidates(after, resume)
        if keys is None:
            yield None, False
        else:
            for key in keys:
                found = point(key)
                if found is None or found:
                    yield key, found is not None
        if resume is None:
            return
        after = resume


def _resume_after(seek_reads: Callable[[int], bool], after: int) -> int | None:
    """The smallest ``x > after`` such that seeking past ``x`` reads again (the end of a damaged stretch),
    found by probing further and further ahead, then bisecting; None when no seek past ``after`` reads."""
    step, good = 1, None
    while after + step <= _MAX_ROWID:
        if seek_reads(after + step):
            good = after + step
            break
        step *= 2
    if good is None:
        return None
    bad = after + step // 2 if step > 1 else after  # seeking past bad fails, past good reads
    while good - bad > 1:
        middle = (bad + good) // 2
        if seek_reads(middle):
            good = middle
        else:
            bad = middle
    return good


def _collect(
    walk: Iterator[tuple[int | None, bool]], name: Callable[[int], tuple[Any, ...]]
) -> tuple[int, list[tuple[Any, ...]], bool]:
    readable, unreadable, complete = 0, [], True
    for key, reads in walk:
        if reads:
            readable += 1
        elif key is None:
            complete = False
        else:
            unreadable.append(name(key))
    return readable, unreadable, complete


# --- rowid tables -----------------------------------------------------------------------------------


def _scan_by_rowid(
    conn: sqlite3.Connection, table: str, keys: list[tuple[str, str]]
) -> tuple[int, list[tuple[Any, ...]], bool]:
    integer_key = len(keys) == 1 and keys[0][1] == "INTEGER"
    by_rowid = _keys_from_index(conn, table, [name for name, _ in keys], integer_key)
    t = _q(table)

    def candidates(after: int, last: int | None) -> Iterable[int] | None:
        if by_rowid:
            return [r for r in sorted(by_rowid) if r > after and (last is None or r <= last)]
        if integer_key and last is not None and last - after <= _MAX_LISTED:
            return range(after + 1, last + 1)
        return None  # no readable key index: the rows in the stretch cannot be named

    walk = _walk(
        lambda a: _reads(
            conn, f"SELECT rowid, * FROM {t} WHERE rowid > ? ORDER BY rowid LIMIT {_BATCH}", (a,)
        ),
        lambda a: _reads(conn, f"SELECT rowid, * FROM {t} WHERE rowid > ? ORDER BY rowid LIMIT 1", (a,)),
        lambda a: _reads(conn, f"SELECT rowid FROM {t} WHERE rowid > ? ORDER BY rowid LIMIT 1", (a,)),
        lambda k: _reads(conn, f"SELECT * FROM {t} WHERE rowid = ?", (k,)),
        candidates,
    )
    return _collect(walk, lambda rowid: by_rowid.get(rowid, (rowid,)))


def _keys_from_index(
    conn: sqlite3.Connection, table: str, names: list[str], integer_key: bool
) -> dict[int, tuple[Any, ...]]:
    """rowid -> primary key, read from an index (its pages, not the table's): the primary-key index, or
    any index when the key is the rowid itself."""
    cols = ", ".join(_q(n) for n in names) if names and not integer_key else "rowid"
    for index in conn.execute(f"PRAGMA index_list({_q(table)})").fetchall():
        if index[4]:  # a partial index holds only some rows
            continue
        indexed = [r[2] for r in conn.execute(f"PRAGMA index_info({_q(index[1])})").fetchall()]
        if integer_key or indexed == names:
            rows = _reads(conn, f"SELECT rowid, {cols} FROM {_q(table)} INDEXED BY {_q(index[1])}")
            if rows is not None:
                return {r[0]: tuple(r[1:]) for r in rows}
    return {}


# --- WITHOUT ROWID tables ---------------------------------------------------------------------------


def _scan_by_parent(
    conn: sqlite3.Connection, table: str, keys: list[tuple[str, str]]
) -> tuple[int, list[tuple[Any, ...]], bool]:
    first = keys[0][0]
    parent = _parent_of(conn, table, first)
    groups = None if parent is None else _reads(conn, _distinct(parent))
    if parent is None or groups is None:
        return 0, [], False  # the groups cannot be listed (no parent, or the parent is damaged too)
    readable = 0
    unreadable: list[tuple[Any, ...]] = []
    complete = True
    for (value,) in groups:
        rows = _reads(conn, f"SELECT * FROM {_q(table)} WHERE {_q(first)} = ?", (value,))
        if rows is not None:
            readable += len(rows)
        elif len(keys) > 1 and keys[1][1] == "INTEGER":
            bound = _group_bound(conn, parent[0], parent[1], value)
            ok, bad, whole = _scan_group(conn, table, first, keys[1][0], value, bound)
            readable += ok
            unreadable.extend(bad)
            complete = complete and whole
        else:
            unreadable.append((value,))  # the group's rows cannot be told apart
            complete = False
    return readable, unreadable, complete


def _distinct(parent: tuple[str, str]) -> str:
    # In key order: without ORDER BY the planner may walk any covering index (sessions by updated_at).
    return f"SELECT DISTINCT {_q(parent[1])} FROM {_q(parent[0])} ORDER BY {_q(parent[1])}"


def _parent_of(conn: sqlite3.Connection, table: str, column: str) -> tuple[str, str] | None:
    """``(parent table, parent column)`` that ``table.column`` references, if any."""
    for fk in conn.execute(f"PRAGMA foreign_key_list({_q(table)})").fetchall():
        if fk[3] == column and fk[4]:
            return fk[2], fk[4]
    return None


def _group_bound(conn: sqlite3.Connection, parent: str, column: str, value: Any) -> int | None:
    """An exclusive upper bound of a group's integer keys, when the parent row records one (a session's
    ``head_seq``: its messages are numbered densely below it)."""
    names = {r[1] for r in conn.execute(f"PRAGMA table_info({_q(parent)})").fetchall()}
    if "head_seq" not in names:
        return None
    rows = _reads(conn, f"SELECT head_seq FROM {_q(parent)} WHERE {_q(column)} = ?", (value,))
    return None if not rows else int(rows[0][0])


def _scan_group(
    conn: sqlite3.Connection, table: str, first: str, second: str, value: Any, bound: int | None
) -> tuple[int, list[tuple[Any, ...]], bool]:
    """Rows of one group (``first = value``) walked in ``second`` order, skipping damaged pages."""
    where = f"FROM {_q(table)} WHERE {_q(first)} = ? AND {_q(second)}"
    order = f"ORDER BY {_q(second)}"

    def candidates(after: int, last: int | None) -> Iterable[int] | None:
        end = last if last is not None else (None if bound is None else bound - 1)
        if end is None or end - after > _MAX_LISTED:
            return None
        return range(after + 1, end + 1)

    walk = _walk(
        lambda a: _reads(conn, f"SELECT {_q(second)}, * {where} > ? {order} LIMIT {_BATCH}", (value, a)),
        lambda a: _reads(conn, f"SELECT {_q(second)}, * {where} > ? {order} LIMIT 1", (value, a)),
        lambda a: _reads(conn, f"SELECT {_q(second)} {where} > ? {order} LIMIT 1", (value, a)),
        lambda k: _reads(conn, f"SELECT * {where} = ?", (value, k)),
        candidates,
    )
    return _collect(walk, lambda key: (value, key))


def rebuild_into(source: str, target: str) -> None:
    """Copy the database at ``source`` into the empty file ``target``, building every index anew from the
    rows: tables are created and filled first, indexes and triggers after, so no page of an old index is
    read (``VACUUM INTO`` would copy index pages as they are)."""
    conn = sqlite3.connect(target, isolation_level=None)
    try:
        conn.execute("ATTACH DATABASE ? AS damaged", (source,))
        objects = conn.execute(
            "SELECT type, name, sql FROM damaged.sqlite_master WHERE sql IS NOT NULL "
            "AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
        ).fetchall()
        conn.execute("BEGIN")
        for kind, name, sql in objects:
            if kind == "table":
                conn.execute(sql)
                conn.execute(f"INSERT INTO main.{_q(name)} SELECT * FROM damaged.{_q(name)}")
        for kind, _, sql in objects:
            if kind in ("index", "trigger", "view"):
                conn.execute(sql)
        conn.execute("COMMIT")
        conn.execute("DETACH DATABASE damaged")
    finally:
        conn.close()
