"""The framework adapters are optional: importing statekeel never imports a framework."""

from __future__ import annotations

import subprocess
import sys


def test_import_statekeel_does_not_import_langgraph() -> None:
    code = (
        "import sys, statekeel, statekeel.integrations\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('langgraph', 'langchain_core'))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_saver_is_reachable_from_the_integrations_package() -> None:
    import statekeel.integrations
    from statekeel.integrations.langgraph import StatekeelSaver

    assert statekeel.integrations.StatekeelSaver is StatekeelSaver
