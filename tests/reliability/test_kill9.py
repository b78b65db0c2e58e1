"""Invariant 1 and 3 under fire: a writer process is SIGKILLed at random instants, 20 times over the same
SQLite file. Every message whose save returned (and was printed) must survive, in order, with dense
sequence numbers and the exact content written; the file must pass ``PRAGMA integrity_check``."""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path

import pytest

from statekeel.demo import reopen_and_verify, run_cycle

CYCLES = 20


@pytest.mark.slow
async def test_acknowledged_messages_survive_20_random_kill_9s(tmp_path: Path) -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    url = f"sqlite:///{tmp_path / 'kill9.db'}"
    acked: dict[str, list[int]] = {}
    killed = 0
    for n in range(CYCLES):
        # Some kills land from the moment the process starts (while it opens or migrates the store),
        # most while it is appending.
        from_spawn = rng.random() < 0.25
        cycle = await run_cycle(url, sessions=3, kill_after_s=rng.uniform(0.0, 0.4), from_spawn=from_spawn)
        killed += cycle.killed
        for key, seqs in cycle.acked.items():
            previous = acked.setdefault(key, [])
            assert not previous or seqs[0] > previous[-1], f"seed {seed} cycle {n}: {key} went backwards"
            previous.extend(seqs)
        verification = await reopen_and_verify(url, acked)
        assert verification.ok, f"seed {seed} cycle {n}: {verification.all_problems()}"
    assert killed == CYCLES, f"seed {seed}: the writer finished on its own instead of being killed"
    total = sum(len(s) for s in acked.values())
    assert total > 200, f"seed {seed}: only {total} messages acknowledged; the test exercised too little"
    conn = sqlite3.connect(tmp_path / "kill9.db")
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    conn.close()
