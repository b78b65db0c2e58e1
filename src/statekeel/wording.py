"""Counts in words, for what the ``statekeel`` commands and the demo print: ``1 tool call``, ``0 rows``,
``2 entries`` — never ``1 tool calls`` or ``1 row(s)``."""

from __future__ import annotations


def plural(noun: str) -> str:
    """The plural of an English ``noun`` (the last word of a phrase): ``call`` → ``calls``, ``batch`` →
    ``batches``, ``entry`` → ``entries``."""
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in ("a", "e", "i", "o", "u"):
        return noun[:-1] + "ies"
    return noun + "s"


def counted(n: int, noun: str, many: str | None = None) -> str:
    """``n`` and ``noun``, singular for exactly one and plural otherwise (``many`` when the plural is not
    made by :func:`plural`): ``counted(1, "tool call")`` is ``1 tool call``, ``counted(0, "row")`` is
    ``0 rows``."""
    return f"{n} {noun if n == 1 else (many or plural(noun))}"


__all__ = ["counted", "plural"]
