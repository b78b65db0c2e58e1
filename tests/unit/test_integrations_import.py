"""The framework adapters are optional: importing statekeel never imports a framework."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

FRAMEWORKS = ("langgraph", "langchain_core", "agents", "opentelemetry", "google")


def test_import_statekeel_does_not_import_a_framework() -> None:
    code = (
        "import sys, statekeel, statekeel.integrations\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r})\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_saver_is_reachable_from_the_integrations_package() -> None:
    import statekeel.integrations
    from statekeel.integrations.langgraph import StatekeelSaver

    assert statekeel.integrations.StatekeelSaver is StatekeelSaver


@pytest.mark.parametrize(
    ("name", "module"),
    [
        ("StatekeelStore", "langgraph_store"),
        ("StatekeelSession", "openai_agents"),
        ("StatekeelTracingProcessor", "openai_agents"),
        ("StatekeelSpanExporter", "otel"),
        ("StatekeelSessionService", "adk"),
    ],
)
def test_each_adapter_is_reachable_from_the_integrations_package(name: str, module: str) -> None:
    import statekeel.integrations

    assert getattr(statekeel.integrations, name) is getattr(
        importlib.import_module(f"statekeel.integrations.{module}"), name
    )


@pytest.mark.parametrize(
    ("module", "framework", "extra"),
    [
        ("openai_agents", "agents", "openai-agents"),
        ("otel", "opentelemetry", "otel"),
        ("langgraph_store", "langgraph", "langgraph"),
        ("adk", "google", "adk"),
    ],
)
def test_an_adapter_names_its_extra_when_its_framework_is_missing(
    tmp_path: Path, module: str, framework: str, extra: str
) -> None:
    blocker = tmp_path / framework
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('not installed here')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(
        [sys.executable, "-c", f"import statekeel.integrations.{module}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode != 0 and f"pip install 'statekeel[{extra}]'" in out.stderr
