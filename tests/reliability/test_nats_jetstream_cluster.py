"""A 3-node JetStream cluster on loopback ports, started by the test from the ``nats-server`` binary with
temporary store directories: the audit stream is replicated 3 times, writers on connections to different
nodes append under load, and the node leading the stream is killed (SIGKILL). Every acknowledged append
is still there at the seq it was given, the chain is dense and verifies, and no append is stored twice;
the time the cluster took to accept appends again is measured and printed.

With ``CI=true`` a missing binary fails; elsewhere these tests are skipped.
"""

from __future__ import annotations

import asyncio
import itertools
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
from statekeel.backends.base import NewMessage

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
BINARY = shutil.which("nats-server") or (
    "/usr/sbin/nats-server" if os.path.exists("/usr/sbin/nats-server") else None
)

pytestmark = pytest.mark.slow


def stall_after(times: list[float], killed_at: float) -> float:
    """The longest wait for an acknowledgement after the kill: how long the cluster took to accept appends
    again (appends acknowledged in flight just after the kill do not hide the stall)."""
    acks = sorted(times)
    return max(
        (b - max(a, killed_at) for a, b in itertools.pairwise(acks) if b > killed_at),
        default=0.0,
    )


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


async def _quiet(exc: Exception) -> None:
    """Refused connections while the nodes start are expected: nothing to log."""


async def wait_ready(cluster: Cluster, deadline_s: float = 30.0) -> None:
    """Until the cluster can place a stream on all three nodes. Account info answers as soon as a meta
    leader is elected, which can be before every peer has joined it: a stream of 3 replicas created
    then is refused with "no suitable peers for placement" (10005). So a probe stream of 3 replicas is
    created (and deleted) before the test opens its stores."""
    import nats
    from nats.js.api import StreamConfig

    started = time.monotonic()
    probe = f"ready_{uuid.uuid4().hex[:8]}"
    while True:
        try:
            nc = await nats.connect(
                [f"nats://127.0.0.1:{n.client_port}" for n in cluster.nodes],
                connect_timeout=1,
                max_reconnect_attempts=0,
                error_cb=_quiet,
            )
            try:
                js = nc.jetstream(timeout=2)
                await js.account_info()
                await js.add_stream(StreamConfig(name=probe, subjects=[f"{probe}.>"], num_replicas=3))
                await js.delete_stream(probe)
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


async def read_when_available(url: str, key: str) -> list[Any]:
    """The session's messages, read by a store of its own (from the stream, not a cache), once the
    cluster answers again (it may still be settling after the election)."""
    for attempt in range(10):
        try:
            async with statekeel.open_store(url) as reader:
                return await reader.backend.read_messages(key)
        except statekeel.BackendUnavailable:
            if attempt == 9:
                raise
            await asyncio.sleep(1)
    raise AssertionError("unreachable")


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
        stall = stall_after(ack_times, killed_at)
        new_leader = await stream_leader(writers[0], f"{prefix}_audit")
        print(
            f"\nleader {leader} killed after {before} appends; {new_leader} took over; appends were "
            f"accepted again after a stall of {stall:.2f} s; {len(acked)} acknowledged, "
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


def test_jetstream_cluster_keeps_session_appends_whole_and_once_when_the_leader_is_killed(
    cluster: Cluster,
) -> None:
    asyncio.run(_session_appends_under_a_killed_leader(cluster))


async def _session_appends_under_a_killed_leader(cluster: Cluster) -> None:
    prefix = f"skc{uuid.uuid4().hex[:8]}"
    url = cluster.url(prefix=prefix, replicas=3, timeout=2)
    writers = [await statekeel.open_store(url) for _ in range(3)]
    await writers[0].backend.create_session("shared")
    acked: dict[str, int] = {}  # append id -> seq of its first message, as acknowledged
    unknown: set[str] = set()
    ack_times: list[float] = []
    stop = asyncio.Event()

    def pair(store: statekeel.Store, item: str) -> list[Any]:
        return [
            NewMessage("user", store.codec.encode({"role": "user", "content": f"{item}/1"})),
            NewMessage("assistant", store.codec.encode({"role": "assistant", "content": f"{item}/2"})),
        ]

    async def writer(n: int, store: statekeel.Store) -> None:
        i = 0
        while not stop.is_set():
            item = f"w{n}-{i}"
            i += 1
            try:
                while True:  # the conditional append: retried at the new head when another came first
                    record = await store.backend.load_session("shared")
                    assert record is not None
                    try:
                        done = await store.backend.append_messages(
                            "shared", record.head_seq, pair(store, item), write_id=item
                        )
                        break
                    except statekeel.ConflictError:
                        continue
            except statekeel.BackendUnavailable:
                unknown.add(item)
                await asyncio.sleep(0.05)
                continue
            acked[item] = done.head_seq - 2
            ack_times.append(time.monotonic())

    try:
        leader = await stream_leader(writers[0], f"{prefix}_sessions")
        tasks = [asyncio.create_task(writer(n, s)) for n, s in enumerate(writers)]
        while len(acked) < 60:
            await asyncio.sleep(0.01)
        killed_at = time.monotonic()
        cluster.kill(leader)
        async with asyncio.timeout(90):
            while len([t for t in ack_times if t > killed_at]) < 60:
                await asyncio.sleep(0.01)
        stop.set()
        await asyncio.gather(*tasks)
        stall = stall_after(ack_times, killed_at)
        print(
            f"\nsessions: leader {leader} killed; appends accepted again after a stall of {stall:.2f} s; "
            f"{len(acked)} acknowledged, {len(unknown)} with an unknown outcome"
        )
        rows = await read_when_available(url, "shared")
        assert [r.seq for r in rows] == list(range(len(rows)))  # dense
        texts = [r.payload["content"] for r in rows]
        assert len(texts) % 2 == 0
        seen: dict[str, int] = {}
        for seq in range(0, len(texts), 2):
            item, part = texts[seq].split("/")
            # Never interleaved: each append's two messages are adjacent, in order.
            assert part == "1" and texts[seq + 1] == f"{item}/2", texts[seq : seq + 2]
            assert item not in seen, f"append {item} stored twice (at {seen[item]} and {seq})"
            seen[item] = seq
        for item, seq in acked.items():
            assert seen.get(item) == seq, f"acknowledged append {item} (seq {seq}) is not there"
        assert set(seen) <= set(acked) | unknown
    finally:
        stop.set()
        for s in writers:
            try:
                await s.close()
            except statekeel.StatekeelError:
                pass
