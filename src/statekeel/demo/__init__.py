"""The demos behind ``statekeel demo``.

The story (the default): a scripted coding agent fixes a failing test in a temporary project, is killed
with SIGKILL at one of its crash points, and resumes; the demo checks that nothing was done twice or lost.

- :mod:`.workspace`: the project, its failing test, and the side-effect counter kept outside the store.
- :mod:`.story_agent`: the agent process (``python -m statekeel.demo.story_agent``) and its crash points.
- :mod:`.story`: runs, kills and restarts the agent, then checks the outcome. :mod:`.story_report`: the
  account printed by ``statekeel demo`` (``--json`` too).

The stress demo (``statekeel demo --stress``): a writer process appends agent turns, is SIGKILLed, and
nothing it acknowledged is lost.

- :mod:`.agent`: the deterministic conversation the writer appends.
- :mod:`.child`: the writer process (``python -m statekeel.demo.child URL``).
- :mod:`.runner`: runs and kills the writer, then reopens and verifies.
- :mod:`.verify`: the verifier. :mod:`.report`: the account printed by ``statekeel demo --stress``.
"""

from __future__ import annotations

from .agent import expected_message, session_key, turn_messages
from .runner import Cycle, DemoFailed, DemoResult, reopen_and_verify, run_cycle, run_demo
from .story import Check, StoryFailed, StoryResult, run_story
from .story_agent import CRASH_POINTS
from .verify import SessionCheck, Verification, check_session, verify

__all__ = [
    "CRASH_POINTS",
    "Check",
    "Cycle",
    "DemoFailed",
    "DemoResult",
    "SessionCheck",
    "StoryFailed",
    "StoryResult",
    "Verification",
    "check_session",
    "expected_message",
    "reopen_and_verify",
    "run_cycle",
    "run_demo",
    "run_story",
    "session_key",
    "turn_messages",
    "verify",
]
