"""A scripted model for the OpenAI Agents SDK (no network) and the SDK items the tests use."""

from __future__ import annotations

import json
from typing import Any

from agents import function_tool
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
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

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("these tests run the model without streaming")


@function_tool
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b
