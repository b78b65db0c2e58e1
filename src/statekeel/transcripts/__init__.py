"""Tool calls and their results in a transcript, in each provider's own format.

A transcript is the list of messages (or items) an agent sends to its model. Three formats ("dialects")
are understood, told apart message by message:

- **OpenAI chat** (``Dialect.OPENAI_CHAT``): an assistant message's ``tool_calls`` (each with an ``id``),
  answered by ``{"role": "tool", "tool_call_id": id, "content": ...}`` messages. The API wants the answers
  right after the assistant message that made the calls: only tool messages may come between it and the
  last of them.
- **OpenAI Responses** (``Dialect.OPENAI_RESPONSES``): items without a role. ``function_call``,
  ``custom_tool_call``, ``computer_call``, ``local_shell_call``, ``shell_call``, ``apply_patch_call`` and a
  ``tool_search_call`` executed by the client carry a ``call_id``, answered by the matching ``*_output``
  item with the same ``call_id`` anywhere after it (a ``local_shell_call`` also by a
  ``function_call_output``, which is how the reference client answers it).
- **Anthropic messages** (``Dialect.ANTHROPIC``): ``tool_use`` blocks (``id``) in an assistant message's
  ``content``, answered by ``tool_result`` blocks (``tool_use_id``) in the *next user turn* — consecutive
  messages of one role form one turn — and before any other block of that turn.

A transcript is **consistent** when every call has exactly one result, placed where its provider accepts
it, and every result answers a call. After a crash between "the model asked for a tool" and "its result was
appended" a call has no result, and every later request to the provider fails. :func:`plan_repair` answers
each such call with an explicit *interrupted* result in its own dialect's shape
(:func:`interrupted_answer`):

- chat: a ``tool`` message, appended after the calls' assistant message and the tool messages that follow
  it;
- Responses: a ``*_output`` item with ``call_id``, appended at the end (the API pairs by ``call_id``);
- Anthropic: one user message of ``tool_result`` blocks with ``is_error: true``, appended when the calls'
  turn is the last one (the API merges it into the user turn that already holds some of their results).

A call whose turn was already followed by other messages (a user message added after a crash without a
repair) cannot be answered by appending: the repair then *inserts* its result where the provider looks for
it (``Repair.insert``), which a stored, append-only history can only apply to the view it hands out.
The interrupted results carry no field of statekeel's own: providers refuse unknown fields.

:func:`safe_window` is the rule of ``Session.history(max_messages)``: a contiguous run of at most
``max_messages`` messages that never starts with a result whose call is outside it and never holds a call
without its result — calls still awaiting theirs (the last turn's) are left out until they have one.

    from statekeel.transcripts import plan_repair

    repair = plan_repair(messages)
    messages.extend(repair.append)      # every call now has exactly one result
"""

from __future__ import annotations

from .index import TranscriptIndex, analyze, interrupted_answer, plan_repair, tool_result
from .items import normalize_item, role_of
from .messages import INTERRUPTED_TEXT, Dialect, Repair, ToolCall, ToolResult, TranscriptState, dialect_of
from .window import safe_window

__all__ = [
    "INTERRUPTED_TEXT",
    "Dialect",
    "Repair",
    "ToolCall",
    "ToolResult",
    "TranscriptIndex",
    "TranscriptState",
    "analyze",
    "dialect_of",
    "interrupted_answer",
    "normalize_item",
    "plan_repair",
    "role_of",
    "safe_window",
    "tool_result",
]
