"""Helpers of the migration tests (imported by them; pytest puts this directory on sys.path)."""

from __future__ import annotations

import os
import sys

from helpers import run_together

OPENER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "opener.py")


def open_concurrently(url: str, n: int, *, timeout: float = 60.0) -> list[str]:
    """Start ``n`` processes that each open ``url`` at the same moment; return their outputs.

    Fails the test if any process fails (its stderr is shown).
    """
    return [
        out.strip()
        for out in run_together([[sys.executable, OPENER, url, str(i)] for i in range(n)], timeout=timeout)
    ]
