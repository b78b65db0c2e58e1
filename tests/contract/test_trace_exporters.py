"""Traces without code: the OpenAI Agents SDK's tracing processor and an OpenTelemetry ``SpanExporter``
write into ``store.traces``, on every backend, and never raise into the agent."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator

import pytest

pytest.importorskip("agents")
pytest.importorskip("opentelemetry.sdk")

import agents
from agents import Agent, Runner, custom_span, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode, format_trace_id

import statekeel
from sdk_fakes import ScriptedModel, add, call, said
from statekeel.integrations.openai_agents import StatekeelTracingProcessor
from statekeel.integrations.otel import StatekeelSpanExporter


@pytest.fixture
def processor(store: statekeel.Store) -> Iterator[StatekeelTracingProcessor]:
    """Our processor as the SDK's only one (the default exports to OpenAI over the network)."""
    made = StatekeelTracingProcessor(store)
    agents.set_trace_processors([made])
    agents.set_tracing_disabled(False)
    try:
        yield made
    finally:
        agents.set_trace_processors([])
        agents.set_tracing_disabled(True)


# --- the Agents SDK's tracing processor --------------------------------------------------------------


async def test_a_runner_run_records_its_spans_with_parent_links(
    store: statekeel.Store, processor: StatekeelTracingProcessor
) -> None:
    model = ScriptedModel([call("call_1")], [said("3")])
    result = await Runner.run(Agent(name="calc", model=model, tools=[add]), "add 1 and 2")
    assert result.final_output == "3"
    page = await store.traces.query(name="Agent workflow")
    assert len(page.items) == 1
    root = page.items[0]
    spans = await store.traces.get(root.trace_id)
    by_id = {s.span_id: s for s in spans}
    assert root.kind == "workflow" and root.parent_span_id is None and root.status == "ok"
    assert root.ended_at is not None
    for span in spans:
        if span.span_id != root.span_id:
            assert span.parent_span_id in by_id, f"{span.name} has a parent that is not in its trace"
        assert span.ended_at is not None and span.ended_at >= span.started_at
    agent = next(s for s in spans if s.kind == "agent")
    assert agent.name == "calc" and agent.attributes["tools"] == ["add"]
    tool = next(s for s in spans if s.kind == "tool")
    assert tool.name == "add" and tool.status == "ok"
    assert tool.attributes["input"] == '{"a": 1, "b": 2}' and tool.attributes["output"] == "3"
    ancestor = tool
    while ancestor.parent_span_id is not None and ancestor.kind != "agent":
        ancestor = by_id[ancestor.parent_span_id]
    assert ancestor is agent  # the tool call sits under the agent that made it
    assert processor.refused == 0


async def test_a_span_with_an_error_is_recorded_as_an_error(
    store: statekeel.Store, processor: StatekeelTracingProcessor
) -> None:
    with trace("nightly") as t, custom_span("deploy", data={"env": "prod"}) as span:
        span.set_error({"message": "timed out", "data": {"after_s": 30}})
    spans = await store.traces.get(t.trace_id)
    deploy = next(s for s in spans if s.name == "deploy")
    assert deploy.status == "error" and deploy.kind == "custom"
    assert deploy.attributes["data"] == {"env": "prod"}
    assert deploy.attributes["error"] == {"message": "timed out", "data": {"after_s": 30}}
    assert deploy.parent_span_id == t.trace_id


async def test_a_span_statekeel_refuses_is_counted_and_the_agent_goes_on(
    store: statekeel.Store, processor: StatekeelTracingProcessor
) -> None:
    with trace("nightly") as t:
        with custom_span("bad\x00name"):  # statekeel refuses NUL in a name: no exception here
            pass
        with custom_span("fine"):
            pass
    assert processor.refused == 2  # the bad span's start and its end
    names = [s.name for s in await store.traces.get(t.trace_id)]
    assert names == ["nightly", "fine"]


async def test_attributes_the_codec_refuses_are_stored_as_text(
    store: statekeel.Store, processor: StatekeelTracingProcessor
) -> None:
    with trace("nightly") as t, custom_span("odd", data={"tags": {"a"}}):
        pass
    odd = next(s for s in await store.traces.get(t.trace_id) if s.name == "odd")
    assert odd.attributes["data"] == {"tags": "{'a'}"}
    assert processor.refused == 0


async def test_a_trace_the_sdk_cannot_export_is_skipped_without_raising(
    store: statekeel.Store, processor: StatekeelTracingProcessor
) -> None:
    t = trace("broken")
    t.export = lambda: 1 / 0  # type: ignore[method-assign]  # the SDK's own export fails
    with t:
        pass
    with trace("fine") as ok:
        pass
    assert await store.traces.get(t.trace_id) == []
    assert [s.name for s in await store.traces.get(ok.trace_id)] == ["fine"]
    assert processor.refused == 0  # the SDK failed, statekeel refused nothing


# --- OpenTelemetry -----------------------------------------------------------------------------------


async def test_an_otel_tracer_provider_writes_spans_into_the_store(store: statekeel.Store) -> None:
    exporter = StatekeelSpanExporter(store)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("my.agent")
    before = dt.datetime.now(dt.UTC)
    with tracer.start_as_current_span(
        "invoke_agent calc", attributes={"gen_ai.operation.name": "invoke_agent"}
    ):
        with tracer.start_as_current_span(
            "execute_tool add", kind=SpanKind.INTERNAL, attributes={"gen_ai.operation.name": "execute_tool"}
        ) as tool:
            tool.set_attribute("gen_ai.tool.call.arguments", '{"a": 1}')
            tool.add_event("retry", {"attempt": 2})
            tool.set_status(Status(StatusCode.ERROR, "boom"))
        with tracer.start_as_current_span("GET /weather", kind=SpanKind.CLIENT) as http:
            http.set_attribute("http.status_codes", (200, 304))
            trace_id = format_trace_id(http.get_span_context().trace_id)
    spans = {s.name: s for s in await store.traces.get(trace_id)}
    agent, tool_span, http_span = spans["invoke_agent calc"], spans["execute_tool add"], spans["GET /weather"]
    assert (agent.kind, tool_span.kind, http_span.kind) == ("agent", "tool", "client")
    assert agent.parent_span_id is None
    assert tool_span.parent_span_id == agent.span_id == http_span.parent_span_id
    assert tool_span.status == "error" and tool_span.attributes["otel.status_description"] == "boom"
    assert tool_span.attributes["otel.events"][0]["name"] == "retry"
    assert tool_span.attributes["otel.events"][0]["attributes"] == {"attempt": 2}
    assert http_span.attributes["http.status_codes"] == [200, 304]
    assert agent.attributes["otel.scope.name"] == "my.agent"
    assert before <= agent.started_at <= tool_span.started_at <= tool_span.ended_at <= agent.ended_at  # type: ignore[operator]
    provider.shutdown()


async def test_a_batch_span_processor_exports_from_its_thread(store: statekeel.Store) -> None:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(StatekeelSpanExporter(store)))
    tracer = provider.get_tracer("my.agent")
    for n in range(20):
        with tracer.start_as_current_span(f"step {n}") as span:
            trace_id = format_trace_id(span.get_span_context().trace_id)
    assert await asyncio.to_thread(provider.force_flush)
    await store.traces.flush()
    page = await store.traces.query(limit=100)
    assert sorted(s.name for s in page.items) == sorted(f"step {n}" for n in range(20))
    assert len(await store.traces.get(trace_id)) == 1
    await asyncio.to_thread(provider.shutdown)


async def test_a_span_statekeel_refuses_is_a_failure_result_never_an_exception(
    store: statekeel.Store,
) -> None:
    exporter = StatekeelSpanExporter(store)
    tracer_provider = TracerProvider()
    tracer = tracer_provider.get_tracer("t")
    good = tracer.start_span("good")
    good.end()
    bad = tracer.start_span("bad\x00name")
    bad.end()
    assert exporter.export([bad, good]) is SpanExportResult.FAILURE  # type: ignore[list-item]
    assert exporter.refused == 1
    trace_id = format_trace_id(good.get_span_context().trace_id)
    assert [s.name for s in await store.traces.get(trace_id)] == ["good"]  # the rest of the batch is kept
    assert exporter.export([good]) is SpanExportResult.SUCCESS  # type: ignore[list-item]
    exporter.shutdown()
    assert exporter.export([good]) is SpanExportResult.FAILURE  # type: ignore[list-item]


async def test_the_exporter_needs_a_store() -> None:
    with pytest.raises(statekeel.InvalidArgument, match="needs an open statekeel Store"):
        StatekeelSpanExporter("sqlite:///x.db")  # type: ignore[arg-type]
