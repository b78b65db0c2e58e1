"""The demo agent's conversation: every message is a pure function of its session key and sequence number.

That lets the verifier check not only that each acknowledged message exists but that its content is
exactly what was written, with no help from the (killed) writer.

A turn is four messages, sized like a real tool-using agent's (~200/300/800/300 bytes encoded): the user
asks, the assistant calls a tool, the tool answers, the assistant replies.
"""

from __future__ import annotations

from typing import Any

MESSAGES_PER_TURN = 4
ROLES = ("user", "assistant", "tool", "assistant")

_FILLER = (
    "The quick brown agent reads the failing test, edits the module, reruns the suite and reports back. "
)


def _text(prefix: str, size: int) -> str:
    body = prefix + " " + _FILLER * (size // len(_FILLER) + 1)
    return body[:size]


def session_key(index: int) -> str:
    """The key of the demo's ``index``-th session."""
    return f"demo-agent-{index}"


def expected_message(key: str, seq: int) -> dict[str, Any]:
    """The message the demo agent writes at ``seq`` of session ``key`` (role included)."""
    turn, part = divmod(seq, MESSAGES_PER_TURN)
    call_id = f"call-{turn}"
    if part == 0:
        return {"role": "user", "content": _text(f"[{key} #{turn}] Please run the tests.", 170)}
    if part == 1:
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": "run_tests",
                        "arguments": (
                            f'{{"path": "tests/test_{turn % 17}.py", "verbose": true, "timeout_s": 120, '
                            '"env": {"PYTHONHASHSEED": "0", "CI": "true"}, '
                            '"extra_args": ["-x", "-q", "--tb=short"]}'
                        ),
                    },
                }
            ],
        }
    if part == 2:
        return {
            "role": "tool",
            "tool_call_id": call_id,
            "content": _text(f"[{key} #{turn}] 41 passed, 1 failed: test_{turn % 17}.py::test_edge.", 760),
        }
    return {"role": "assistant", "content": _text(f"[{key} #{turn}] One test fails; fixing it.", 270)}


def turn_messages(key: str, first_seq: int) -> list[dict[str, Any]]:
    """The four messages of the turn starting at ``first_seq`` (a multiple of four)."""
    return [expected_message(key, first_seq + i) for i in range(MESSAGES_PER_TURN)]
