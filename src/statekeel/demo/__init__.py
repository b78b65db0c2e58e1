"""The crash-and-resume demo: a writer process appends agent turns, is SIGKILLed, and nothing it
acknowledged is lost.

- :mod:`.agent`: the deterministic conversation the writer appends.
- :mod:`.child`: the writer process (``python -m statekeel.demo.child URL``).
- :mod:`.runner`: runs and kills the writer, then reopens and verifies.
- :mod:`.verify`: the verifier. :mod:`.report`: the account printed by ``statekeel demo``.
"""

from __future__ import annotations

from .agent import expected_message, session_key, turn_messages
from .runner import Cycle, DemoFailed, DemoResult, reopen_and_verify, run_cycle, run_demo
from .verify import SessionCheck, Verification, check_session, verify

__all__ = [
    "Cycle",
    "DemoFailed",
    "DemoResult",
    "SessionCheck",
    "Verification",
    "check_session",
    "expected_message",
    "reopen_and_verify",
    "run_cycle",
    "run_demo",
    "session_key",
    "turn_messages",
    "verify",
]
