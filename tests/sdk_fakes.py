"""A scripted model for the OpenAI Agents SDK (no network) and the SDK items the tests use."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from agents import function_tool
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_reasoning_item import Summary


def call(call_id: str, name: str = "add", arguments: str = '{"a": 1, "b": 2}') -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc_{call_id}", call_id=call_id, name=name, arguments=arguments, type="function_call",
        status="completed",
    )  # fmt: skip


def reasoning(text: str = "think") -> ResponseReasoningItem:
    summary = [Summary(text=text, type="summary_text")]
    return ResponseReasoningItem(id="rs_1", type="reasoning", summary=summary)


def said(text: str, item_id: str = "msg_1") -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=item_id, type="message", role="assistant", status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )  # fmt: skip


class ScriptedModel(Model):
    """A model that answers from a script (one list of output items per call) and keeps each input."""

    def __init__(self, *turns: list[Any]) -> None:
        self.turns = list(turns)
        self.inputs: list[list[dict[str, Any]]] = []

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        self.inputs.append(json.loads(json.dumps(input)) if isinstance(input, list) else [input])
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        # The whole answer as one completed event, which is what the SDK's run loop reads.
        answer = await self.get_response(*args, **kwargs)
        response = Response(
            id=f"resp_{len(self.inputs)}", created_at=0, model="scripted", object="response",
            output=answer.output, tool_choice="auto", tools=[], parallel_tool_calls=False,
        )  # fmt: skip
        yield ResponseCompletedEvent(type="response.completed", response=response, sequence_number=0)


@function_tool
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@function_tool(needs_approval=True)
async def remove(path: str) -> str:
    """Remove a file (after a human approved it)."""
    return f"removed {path}"
