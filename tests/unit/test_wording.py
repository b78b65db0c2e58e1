"""Counts in words (``statekeel.wording``): what the commands and the demo print."""

from __future__ import annotations

import pytest

from statekeel.wording import counted, plural


@pytest.mark.parametrize(
    ("n", "noun", "said"),
    [
        (0, "row", "0 rows"),
        (1, "row", "1 row"),
        (2, "row", "2 rows"),
        (1, "tool call", "1 tool call"),
        (2, "tool call", "2 tool calls"),
        (1, "entry", "1 entry"),
        (0, "audit entry", "0 audit entries"),
        (3, "batch", "3 batches"),
        (2, "key", "2 keys"),
    ],
)
def test_a_count_is_singular_for_exactly_one_and_plural_otherwise(n: int, noun: str, said: str) -> None:
    assert counted(n, noun) == said


def test_an_irregular_plural_is_given_by_the_caller() -> None:
    assert counted(2, "child", "children") == "2 children"
    assert counted(1, "child", "children") == "1 child"


def test_plural_of_the_last_word() -> None:
    assert [plural(w) for w in ("call", "match", "box", "bus", "copy", "day")] == [
        "calls",
        "matches",
        "boxes",
        "buses",
        "copies",
        "days",
    ]
