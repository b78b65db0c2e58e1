"""Helpers of the migration tests (imported by them; pytest puts this directory on sys.path)."""

from __future__ import annotations

import os
import subprocess
import sys

OPENER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "opener.py")


def open_concurrently(url: str, n: int, *, timeout: float = 60.0) -> list[str]:
    """Start ``n`` processes that each open ``url`` at the same moment; return their outputs.

    Fails the test if any process fails (its stderr is shown).
    """
    procs = [
        subprocess.Popen(
            [sys.executable, OPENER, url, str(i)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:  # release them together: the barrier
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = []
        for i, proc in enumerate(procs):
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, f"opener {i} failed ({proc.returncode}):\n{err}"
            outputs.append(out.strip())
        return outputs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
