"""The messages every store in the bench writes: one agent turn is four messages.

A turn is a user text (~200 bytes as JSON), an assistant message with a tool call (~300), the tool result
(~800) and the assistant's answer (~300), as in the issue. Text varies per turn so that no store benefits
from identical payloads.
"""

from __future__ import annotations

from typing import Any

import orjson

_TEXT = (
    "agent repository test failure patch branch module import request latency retry budget cache "
    "session review deploy rollback config schema index query plan worker queue shard replica"
)
_WORDS = _TEXT.split(" ")


def _text(n_bytes: int, seed: int) -> str:
    words: list[str] = []
    size = 0
    i = seed
    while size < n_bytes:
        word = _WORDS[(i * 7 + size) % len(_WORDS)]
        words.append(word)
        size += len(word) + 1
        i += 1
    return " ".join(words)[:n_bytes]


def turn(i: int) -> list[dict[str, Any]]:
    """The four messages of turn ``i`` (plain JSON values only)."""
    call_id = f"call_{i:06d}"
    return [
        {"role": "user", "content": _text(170, i)},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": "run_tests",
                        "arguments": orjson.dumps({"path": _text(150, i)}).decode(),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": _text(740, i + 1)},
        {"role": "assistant", "content": _text(270, i + 2)},
    ]


def turn_sizes() -> list[int]:
    """JSON sizes of one turn's messages, for the report."""
    return [len(orjson.dumps(m)) for m in turn(0)]
