"""A 3-node JetStream cluster on loopback ports, started by the test from the ``nats-server`` binary with
temporary store directories: the audit stream is replicated 3 times, writers on connections to different
nodes append under load, and the node leading the stream is killed (SIGKILL). Every acknowledged append
is still there at the seq it was given, the chain is dense and verifies, and no append is stored twice;
the time the cluster took to accept appends again is measured and printed.

With ``CI=true`` a missing binary fails; elsewhere these tests are skipped.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import statekeel

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
BINARY = shutil.which("nats-server") or (
    "/usr/sbin/nats-server" if os.path.exists("/usr/sbin/nats-server") else None
)

pytestmark = pytest.mark.slow


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Node:
    name: str
    client_port: int
    cluster_port: int
    store_dir: Path
    proc: subprocess.Popen[bytes] | None = None


class Cluster:
    def __init__(self, root: Path) -> None:
        ports = free_ports(6)
        self.nodes = [Node(f"sk-n{i}", ports[i], ports[3 + i], root / f"n{i}") for i in range(3)]

    def start(self, node: Node) -> None:
        routes = ",".join(f"nats://127.0.0.1:{n.cluster_port}" for n in self.nodes if n is not node)
        node.store_dir.mkdir(mode=0o700, exist_ok=True)
        node.proc = subprocess.Popen(
            [
                str(BINARY),
                "-a", "127.0.0.1",
                "-p", str(node.client_port),
                "-js",
                "-sd", str(node.store_dir),
                "--server_name", node.name,
                "--cluster_name", "statekeel-test",
                "--cluster", f"nats://127.0.0.1:{node.cluster_port}",
                "--routes", routes,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def url(self, **options: Any) -> str:
        hosts = ",".join(f"127.0.0.1:{n.client_port}" for n in self.nodes)
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"nats://{hosts}?{query}"

    def kill(self, name: str) -> Node:
        node = next(n for n in self.nodes if n.name == name)
        assert node.proc is not None
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(timeout=10)
        return node

    def stop_all(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait(timeout=10)


async def wait_ready(cluster: Cluster, deadline_s: float = 30.0) -> None:
    """Until the cluster has elected its JetStream meta leader (account info answers)."""
    import nats

    started = time.monotonic()
    while True:
        try:
            nc = await nats.connect(
                [f"nats://127.0.0.1:{n.client_port}" for n in cluster.nodes],
                connect_timeout=1,
                max_reconnect_attempts=0,
            )
            try:
                await nc.jetstream(timeout=1).account_info()
                return
            finally:
                await nc.close()
        except Exception:
            if time.monotonic() - started > deadline_s:
                raise
            await asyncio.sleep(0.2)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    if BINARY is None:
        if IN_CI:
            pytest.fail("CI=true requires the nats-server binary (Debian's nats-server package)")
        pytest.skip("the nats-server binary is not installed")
    c = Cluster(tmp_path)
    try:
        for node in c.nodes:
            c.start(node)
        asyncio.run(wait_ready(c))
        yield c
    finally:
        c.stop_all()


async def stream_leader(store: statekeel.Store, stream: str) -> str:
    js = store.backend.conn.js  # type: ignore[attr-defined]
    while True:
        info = await js.stream_info(stream)
        if info.cluster is not None and info.cluster.leader:
            return str(info.cluster.leader)
        await asyncio.sleep(0.1)


def test_jetstream_cluster_keeps_every_acknowledged_append_when_the_leader_is_killed(
    cluster: Cluster,
) -> None:
    asyncio.run(_killed_leader_under_load(cluster))


async def _killed_leader_under_load(cluster: Cluster) -> None:
    prefix = f"skc{uuid.uuid4().hex[:8]}"
    url = cluster.url(prefix=prefix, replicas=3, timeout=2)
    # Each writer has its own connection; each append carries a unique id in its data.
    writers = [await statekeel.open_store(url) for _ in range(3)]
    acked: dict[str, int] = {}  # append id -> seq the server acknowledged
    unknown: set[str] = set()  # appends that raised: stored at most once, or not at all
    ack_times: list[float] = []
    stop = asyncio.Event()

    async def writer(n: int, store: statekeel.Store) -> None:
        i = 0
        while not stop.is_set():
            item = f"w{n}-{i}"
            i += 1
            try:
                entry = await store.audit.append("load", f"writer-{n}", f"item:{n}", {"id": item})
            except statekeel.BackendUnavailable:
                unknown.add(item)
                await asyncio.sleep(0.05)
                continue
            acked[item] = entry.seq
            ack_times.append(time.monotonic())

    try:
        leader = await stream_leader(writers[0], f"{prefix}_audit")
        tasks = [asyncio.create_task(writer(n, s)) for n, s in enumerate(writers)]
        while len(acked) < 150:
            await asyncio.sleep(0.01)
        before = len(acked)
        killed_at = time.monotonic()
        cluster.kill(leader)
        # Load continues until 150 more appends were acknowledged after the kill.
        async with asyncio.timeout(90):
            while len([t for t in ack_times if t > killed_at]) < 150:
                await asyncio.sleep(0.01)
        stop.set()
        await asyncio.gather(*tasks)
        first_after = min(t for t in ack_times if t > killed_at)
        new_leader = await stream_leader(writers[0], f"{prefix}_audit")
        print(
            f"\nleader {leader} killed after {before} appends; {new_leader} took over; appends were "
            f"accepted again {first_after - killed_at:.2f} s after the kill; {len(acked)} acknowledged, "
            f"{len(unknown)} with an unknown outcome"
        )
        assert new_leader != leader

        entries: list[Any] = []
        while True:
            page = await writers[1].audit.query(limit=1000, after_seq=len(entries))
            entries.extend(page)
            if len(page) < 1000:
                break
        # Dense, in the stream's order, verifying as one chain.
        assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
        report = await writers[2].audit.verify()
        assert report.ok and report.count == len(entries)
        stored: dict[str, int] = {}
        for e in entries:
            item = e.data["id"]
            assert item not in stored, f"append {item} stored twice (seqs {stored[item]} and {e.seq})"
            stored[item] = e.seq
        # No acknowledged append lost, each where its acknowledgement said.
        for item, seq in acked.items():
            assert stored.get(item) == seq, f"acknowledged append {item} (seq {seq}) is not there"
        assert set(stored) <= set(acked) | unknown
    finally:
        stop.set()
        for s in writers:
            try:
                await s.close()
            except statekeel.StatekeelError:
                pass
