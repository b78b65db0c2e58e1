"""The demo's parent side: run the writer, SIGKILL it at a random moment, reopen and verify.

result = await run_demo("sqlite:////path/to/demo.db", sessions=3, cycles=1, rng=random.Random(7))
assert result.verification.ok
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from ..errors import StatekeelError
from ..store import open_store
from .agent import session_key
from .verify import Verification, verify

READY_TIMEOUT_S = 30.0
# The kill lands this long after the writer reported ready (uniformly at random): long enough for a few
# hundred turns, short enough to keep the demo to a few seconds.
KILL_WINDOW_S = (0.2, 1.2)


class DemoFailed(StatekeelError):
    """The demo could not run (the writer failed on its own, or never started)."""

    hint = "See the writer's error output above; the store itself may be fine."


@dataclass(slots=True)
class Cycle:
    """One writer run: what it acknowledged and how it ended."""

    pid: int
    kill_after_s: float
    ready: bool = False
    killed: bool = False
    returncode: int | None = None
    acked: dict[str, list[int]] = field(default_factory=dict)
    stderr: str = ""

    @property
    def acknowledged(self) -> int:
        return sum(len(v) for v in self.acked.values())


@dataclass(slots=True)
class DemoResult:
    url: str
    cycles: list[Cycle]
    verification: Verification
    verify_s: float

    @property
    def ok(self) -> bool:
        return self.verification.ok


async def _read_acks(stream: asyncio.StreamReader, cycle: Cycle, ready: asyncio.Event) -> None:
    while True:
        line = await stream.readline()
        if not line:
            return
        if not line.endswith(b"\n"):
            continue  # cut off by the kill: never acknowledged
        parts = line.decode("utf-8", "replace").split()
        if parts[:1] == ["ack"] and len(parts) == 3:
            cycle.acked.setdefault(parts[1], []).append(int(parts[2]))
        elif parts[:1] == ["ready"]:
            cycle.ready = True
            ready.set()


async def run_cycle(
    url: str,
    *,
    sessions: int = 3,
    kill_after_s: float,
    from_spawn: bool = False,
    max_turns: int | None = None,
) -> Cycle:
    """Start the writer on ``url`` and SIGKILL it ``kill_after_s`` after it is ready (or after spawning it,
    with ``from_spawn``: then the kill may land while it opens or migrates the store)."""
    args = [sys.executable, "-m", "statekeel.demo.child", url, "--sessions", str(sessions)]
    if max_turns is not None:
        args += ["--max-turns", str(max_turns)]
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    cycle = Cycle(pid=proc.pid, kill_after_s=kill_after_s)
    ready = asyncio.Event()
    reader = asyncio.create_task(_read_acks(proc.stdout, cycle, ready))
    errors = asyncio.create_task(proc.stderr.read())
    exited = asyncio.create_task(proc.wait())
    try:
        if not from_spawn:
            waiter = asyncio.create_task(ready.wait())
            await asyncio.wait({waiter, exited}, timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        if proc.returncode is None:
            # The kill moment itself; returns early only if the writer dies on its own.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(exited), timeout=kill_after_s)
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            cycle.killed = True
    finally:
        if proc.returncode is None and not cycle.killed:
            proc.kill()  # the parent was interrupted: never leave a writer behind
        cycle.returncode = await exited
        await reader
        cycle.stderr = (await errors).decode("utf-8", "replace")
    if not cycle.killed and cycle.returncode != 0:
        tail = "\n".join(cycle.stderr.strip().splitlines()[-15:])
        raise DemoFailed(f"the writer (pid {cycle.pid}) exited with code {cycle.returncode}:\n{tail}")
    return cycle


async def reopen_and_verify(url: str, acked: Mapping[str, list[int]]) -> Verification:
    """Open the store as a fresh process would and verify the sessions in ``acked`` (the demo's: every
    session it wrote is a key, with what was acknowledged); a failed open is a failed verification."""
    try:
        async with open_store(url) as store:
            return await verify(store, acked)
    except StatekeelError as exc:
        return Verification((), (), (f"the store could not be reopened: {type(exc).__name__}: {exc}",))


Verifier = Callable[[str, Mapping[str, list[int]]], Awaitable[Verification]]


async def run_demo(
    url: str,
    *,
    sessions: int = 3,
    cycles: int = 1,
    rng: random.Random | None = None,
    verifier: Verifier | None = None,
) -> DemoResult:
    """Run ``cycles`` write-and-kill cycles on ``url``, verifying after each the sessions the writer
    wrote (never the store's other sessions); stop at the first failure."""
    rng = rng or random.Random()
    verifier = verifier or reopen_and_verify
    done: list[Cycle] = []
    # Every session the writer writes, acknowledged or not yet: only those are the demo's to verify.
    acked: dict[str, list[int]] = {session_key(i): [] for i in range(sessions)}
    verification = Verification(())
    verify_s = 0.0
    for _ in range(cycles):
        cycle = await run_cycle(url, sessions=sessions, kill_after_s=rng.uniform(*KILL_WINDOW_S))
        done.append(cycle)
        for key, seqs in cycle.acked.items():
            acked.setdefault(key, []).extend(seqs)
        started = time.perf_counter()
        verification = await verifier(url, acked)
        verify_s = time.perf_counter() - started
        if not verification.ok:
            break
    return DemoResult(url, done, verification, verify_s)
