"""Framework adapters: adopt statekeel in one line from the framework you already use.

- LangGraph: :class:`statekeel.integrations.langgraph.StatekeelSaver`, a ``BaseCheckpointSaver`` whose
  checkpoints live in a statekeel store (``pip install 'statekeel[langgraph]'``)::

      from statekeel.integrations.langgraph import StatekeelSaver

      async with StatekeelSaver.from_url("sqlite:///agent.db") as saver:
          graph = builder.compile(checkpointer=saver)

- LangGraph's long-term memory: :class:`statekeel.integrations.langgraph_store.StatekeelStore`, a
  ``BaseStore`` on ``store.memory`` (and ``store.vectors`` for semantic search).
- The OpenAI Agents SDK (``pip install 'statekeel[openai-agents]'``):
  :class:`statekeel.integrations.openai_agents.StatekeelSession`, the SDK's ``Session``, and
  :class:`~statekeel.integrations.openai_agents.StatekeelTracingProcessor`, its tracing processor::

      session = StatekeelSession("user-42", "sqlite:///agent.db")
      await Runner.run(agent, "run the tests", session=session)

- Google ADK (``pip install 'statekeel[adk]'``):
  :class:`statekeel.integrations.adk.StatekeelSessionService`, a ``BaseSessionService``::

      runner = Runner(agent=agent, app_name="shop", session_service=StatekeelSessionService(url))

- OpenTelemetry (``pip install 'statekeel[otel]'``):
  :class:`statekeel.integrations.otel.StatekeelSpanExporter`, a ``SpanExporter`` into ``store.traces``.

Each adapter lives in its own module and imports its framework only when that module is imported:
``import statekeel`` (and ``import statekeel.integrations``) never imports a framework.
"""

from __future__ import annotations

import importlib
from typing import Any

# Name -> module, imported on first access so that a missing optional framework costs nothing until used.
_LAZY = {
    "StatekeelSaver": "statekeel.integrations.langgraph",
    "StatekeelStore": "statekeel.integrations.langgraph_store",
    "StatekeelSession": "statekeel.integrations.openai_agents",
    "StatekeelTracingProcessor": "statekeel.integrations.openai_agents",
    "StatekeelSpanExporter": "statekeel.integrations.otel",
    "StatekeelSessionService": "statekeel.integrations.adk",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'statekeel.integrations' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = list(_LAZY)
