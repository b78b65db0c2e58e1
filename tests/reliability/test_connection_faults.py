"""Faults between statekeel and its database: a COMMIT whose answer never arrives (a TCP proxy drops it),
connections killed by the server while many writers run, and calls cancelled at any point.

What users depend on: a write whose call returned is there; a write whose call raised is either wholly
there or wholly absent — never half, never twice — and the error says which (``outcome="unknown"`` when
statekeel cannot know); the store goes on working without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import statekeel
from helpers import message

# --- a proxy that loses the answer to COMMIT ----------------------------------------------------------

_SSL_REQUEST, _GSS_REQUEST = 80877103, 80877104


class CommitAnswerDropper:
    """A TCP proxy in front of PostgreSQL. Armed with :meth:`drop_next_commit_answer`, it forwards the next
    ``COMMIT`` to the server, waits for the server's answer — so the transaction *has* committed — and
    then cuts the client off without passing the answer on."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.armed = False
        self.armed_statement = 0
        self.dropped = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def drop_next_commit_answer(self) -> None:
        self.armed = True

    def drop_next_statement_answer(self, times: int = 1) -> None:
        """Drop the answer to the next statement the client executes (extended protocol: Execute, then
        Sync), and to the ``times - 1`` after it (each on its own connection: the statement's re-runs). A
        statement outside a transaction commits as it runs: a session save on PostgreSQL is one."""
        self.armed_statement = times

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(self.host, self.port)
        committed = asyncio.Event()
        up = asyncio.create_task(self._client_to_server(client_r, server_w, committed))
        down = asyncio.create_task(self._server_to_client(server_r, client_w, committed))
        self._tasks |= {up, down}
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (up, down):
                task.cancel()
            for writer in (client_w, server_w):
                writer.transport.abort()
            self._tasks -= {up, down}

    async def _client_to_server(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, committed: asyncio.Event
    ) -> None:
        typed = False
        executed = False
        while True:
            if typed:
                head = await reader.readexactly(5)
                kind, length = head[:1], struct.unpack("!I", head[1:])[0]
            else:  # startup-phase messages carry no type byte
                head = await reader.readexactly(4)
                kind, length = b"", struct.unpack("!I", head)[0]
            body = await reader.readexactly(length - 4)
            if not typed:
                code = struct.unpack("!I", body[:4])[0] if len(body) >= 4 else 0
                typed = code not in (_SSL_REQUEST, _GSS_REQUEST)
            if self.armed and kind == b"Q" and body.lstrip().upper().startswith(b"COMMIT"):
                self.armed = False
                committed.set()
            if self.armed_statement and kind == b"E":
                executed = True
            if executed and kind == b"S":
                self.armed_statement -= 1
                executed = False
                committed.set()
            writer.write(head + body)
            await writer.drain()

    async def _server_to_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, committed: asyncio.Event
    ) -> None:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            if committed.is_set():
                # The server answered COMMIT (it is done): the client never hears of it.
                self.dropped += 1
                return
            writer.write(data)
            await writer.drain()


@contextlib.asynccontextmanager
async def _through_proxy(db_url: str) -> AsyncIterator[tuple[str, CommitAnswerDropper]]:
    parts = urlsplit(db_url)
    proxy = CommitAnswerDropper(parts.hostname or "127.0.0.1", parts.port or 5432)
    port = await proxy.start()
    user = f"{parts.username}@" if parts.username else ""
    try:
        yield f"postgresql://{user}127.0.0.1:{port}{parts.path}?pool_max_size=2", proxy
    finally:
        await proxy.close()


@pytest.mark.postgres
async def test_a_commit_whose_answer_is_lost_raises_unknown_outcome_and_a_re_read_settles_it(
    pg_migrated: str,
) -> None:
    async with _through_proxy(pg_migrated) as (url, proxy), statekeel.open_store(url) as store:
        b = store.backend
        await b.append_messages("s", 0, [message(store, "kept")], create=True)

        # A save outside atomic() is one statement that commits as it runs: its answer is what is lost.
        proxy.drop_next_statement_answer()
        with pytest.raises(statekeel.BackendUnavailable) as info:
            await b.append_messages("s", 1, [message(store, "answer lost")])
        assert info.value.outcome == "unknown"  # type: ignore[attr-defined]
        assert "re-read" in str(info.value)
        assert proxy.dropped == 1
        # It committed: a re-read shows it once, and the conditional retry says so instead of doubling it.
        assert [m.payload["content"] for m in await b.read_messages("s")] == ["kept", "answer lost"]
        with pytest.raises(statekeel.ConflictError) as conflict:
            await b.append_messages("s", 1, [message(store, "answer lost")])
        assert conflict.value.current == 2  # type: ignore[attr-defined]

        # A task transition and an audit append: the same, and the store goes on.
        task = await store.tasks.create("deploy", status="queued")
        proxy.drop_next_commit_answer()
        with pytest.raises(statekeel.BackendUnavailable):
            await store.tasks.claim("w1")
        claimed = await store.tasks.get(task.id)
        assert claimed is not None and (claimed.status, claimed.lease_owner) == ("running", "w1")
        proxy.drop_next_commit_answer()
        with pytest.raises(statekeel.BackendUnavailable):
            await store.audit.append("tool.call", "agent", "task:1", {"n": 1})
        entries = await store.audit.query(kind="tool.call")
        assert [e.data for e in entries] == [{"n": 1}]
        # The claim whose answer was lost committed with its audit entry, once.
        claims = await store.audit.query(subject=f"task:{task.id}", kind="task.transitioned")
        assert [(e.data["to"], e.actor) for e in claims] == [("running", "w1")]
        await store.audit.append("tool.call", "agent", "task:1", {"n": 2})
        # The task's creation and claim, and the two appended by hand.
        assert (await store.audit.verify()).count == 4


async def _rerun_after(store: statekeel.Store, monkeypatch: pytest.MonkeyPatch, between: Any) -> None:
    """Run ``between()`` when the backend has met the lost answer and before it runs the save again."""
    b = store.backend
    lost = b._lost  # type: ignore[attr-defined]

    async def lost_then(exc: BaseException, retries: Any) -> None:
        await lost(exc, retries)
        await between()

    monkeypatch.setattr(b, "_lost", lost_then)


@pytest.mark.postgres
@pytest.mark.parametrize("write_id", [None, "w-1"])
async def test_a_save_re_run_after_its_lost_answer_and_a_lease_takeover_is_never_reported_refused(
    pg_migrated: str, monkeypatch: pytest.MonkeyPatch, write_id: str | None
) -> None:
    async with (
        _through_proxy(pg_migrated) as (url, proxy),
        statekeel.open_store(url) as store,
        statekeel.open_store(pg_migrated) as other,
    ):
        b = store.backend
        await b.append_messages("s", 0, [message(store, "kept")], create=True)
        mine = await b.acquire_session_lease("s", "A", 30)

        async def taken_over() -> None:
            assert await other.backend.release_session_lease(mine)
            assert (await other.backend.acquire_session_lease("s", "B", 30)).acquired

        await _rerun_after(store, monkeypatch, taken_over)
        proxy.drop_next_statement_answer()
        if write_id is None:
            # The re-run is refused because the lease is B's now: that says nothing of the first run.
            with pytest.raises(statekeel.BackendUnavailable) as info:
                await b.append_messages("s", 1, [message(store, "landed")], lease=mine)
            assert info.value.outcome == "unknown"  # type: ignore[attr-defined]
        else:
            # Its own write id in the row: the first run landed, settled as saved.
            record = await b.append_messages(
                "s", 1, [message(store, "landed")], lease=mine, write_id=write_id
            )
            assert (record.head_seq, record.write_id) == (2, write_id)
        assert proxy.dropped == 1
        assert [m.payload["content"] for m in await b.read_messages("s")] == ["kept", "landed"]


@pytest.mark.postgres
async def test_a_save_re_run_after_its_lost_answer_and_a_delete_is_unknown_not_not_found(
    pg_migrated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        _through_proxy(pg_migrated) as (url, proxy),
        statekeel.open_store(url) as store,
        statekeel.open_store(pg_migrated) as other,
    ):
        b = store.backend
        await b.append_messages("s", 0, [message(store, "kept")], create=True)

        async def deleted() -> None:
            assert await other.backend.delete_session("s")

        await _rerun_after(store, monkeypatch, deleted)
        proxy.drop_next_statement_answer()
        with pytest.raises(statekeel.BackendUnavailable) as info:
            await b.append_messages("s", 1, [message(store, "landed")], write_id="w-1")
        assert info.value.outcome == "unknown"  # type: ignore[attr-defined]
        assert proxy.dropped == 1


@pytest.mark.postgres
async def test_a_lost_commit_answer_in_an_atomic_block_is_unknown_and_the_block_landed_whole(
    pg_migrated: str,
) -> None:
    async with _through_proxy(pg_migrated) as (url, proxy), statekeel.open_store(url) as store:
        proxy.drop_next_commit_answer()
        with pytest.raises(statekeel.BackendUnavailable) as info:
            await store.approvals.request("task:1", "deploy", {"env": "prod"}, "agent")
        assert info.value.outcome == "unknown"  # type: ignore[attr-defined]
        # The approval and its audit entry committed together, and they verify.
        [pending] = await store.approvals.pending()
        report = await store.audit.verify()
        assert report.ok and report.count == 1 and report.approvals == 1
        assert pending.args == {"env": "prod"}


def fallback_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file()]


@contextlib.asynccontextmanager
async def _after_a_lost_commit_answer(
    db_url: str, fallback: Path
) -> AsyncIterator[tuple[statekeel.Store, statekeel.Session]]:
    """A store through the proxy, and its session "s" with "kept" saved, then "answer lost" saved by a save
    whose COMMIT answer was lost: it committed, and the save (not knowing) also wrote its fallback file."""
    async with (
        _through_proxy(db_url) as (url, proxy),
        statekeel.open_store(url, fallback_dir=fallback) as store,
    ):
        s = await store.sessions.get_or_create("s")
        s.add_message("user", "kept")
        await store.sessions.save(s)
        s.add_message("assistant", "answer lost")
        # The save commits as its one statement runs; the answer to its re-run on a fresh connection is
        # lost too (were it heard, the re-run's refusal would be settled by the write id at once).
        proxy.drop_next_statement_answer(times=2)
        await store.sessions.save(s)
        assert proxy.dropped == 2
        assert len(fallback_files(fallback)) == 1
        yield store, s


async def _contents(store: statekeel.Store) -> list[str]:
    return [m.payload["content"] for m in await store.backend.read_messages("s")]


@pytest.mark.postgres
async def test_a_save_whose_commit_answer_was_lost_is_settled_by_the_next_save_and_its_fallback_file_removed(
    pg_migrated: str, tmp_path: Path
) -> None:
    fallback = tmp_path / "fallback"
    async with _after_a_lost_commit_answer(pg_migrated, fallback) as (store, s):
        s.add_message("user", "next")
        await store.sessions.save(s)  # its own write, recognised: no ConflictError, nothing twice
        assert await _contents(store) == ["kept", "answer lost", "next"]
        assert fallback_files(fallback) == []
        assert (await store.sessions.replay_fallback()).ok


@pytest.mark.postgres
async def test_the_fallback_file_of_a_lost_commit_answer_is_removed_by_replay_not_written_twice(
    pg_migrated: str, tmp_path: Path
) -> None:
    fallback = tmp_path / "fallback"
    async with _after_a_lost_commit_answer(pg_migrated, fallback) as (store, s):
        report = await store.sessions.replay_fallback()
        assert report.ok and report.stale == ["s"] and not report.replayed
        assert fallback_files(fallback) == []
        assert await _contents(store) == ["kept", "answer lost"]
        assert not s.is_dirty()
        s.add_message("user", "next")
        await store.sessions.save(s)
        assert await _contents(store) == ["kept", "answer lost", "next"]


@pytest.mark.postgres
async def test_another_process_loading_after_a_lost_commit_answer_removes_the_covered_fallback_file(
    pg_migrated: str, tmp_path: Path
) -> None:
    fallback = tmp_path / "fallback"
    async with _after_a_lost_commit_answer(pg_migrated, fallback):
        pass  # that process ends
    async with statekeel.open_store(pg_migrated, fallback_dir=fallback) as restarted:
        s = await restarted.sessions.load("s")
        assert s is not None and [m["content"] for m in s.messages] == ["kept", "answer lost"]
        assert not s.is_dirty()
        assert fallback_files(fallback) == []
        assert await _contents(restarted) == ["kept", "answer lost"]


@pytest.mark.postgres
async def test_a_save_in_an_atomic_block_whose_commit_answer_was_lost_is_settled_by_the_next_save(
    pg_migrated: str,
) -> None:
    async with _through_proxy(pg_migrated) as (url, proxy), statekeel.open_store(url) as store:
        s = await store.sessions.get_or_create("s")
        s.add_message("user", "kept")
        await store.sessions.save(s)
        s.add_message("assistant", "answer lost")
        proxy.drop_next_commit_answer()
        with pytest.raises(statekeel.BackendUnavailable):
            async with store.backend.atomic():
                await store.sessions.save(s)
                s.add_message("assistant", "lost too")
                await store.sessions.save(s)
        assert [m["content"] for m in s.unsaved()] == ["answer lost", "lost too"]  # it cannot know
        s.add_message("user", "next")
        await store.sessions.save(s)
        assert await _contents(store) == ["kept", "answer lost", "lost too", "next"]
        assert not s.is_dirty()


# --- connections killed while writers run -------------------------------------------------------------


async def _terminate_connections(db_url: str) -> int:
    import asyncpg

    admin = await asyncpg.connect(db_url.rsplit("/", 1)[0] + "/postgres")
    try:
        rows = await admin.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> "
            "pg_backend_pid()",
            urlsplit(db_url).path.lstrip("/"),
        )
        return len(rows)
    finally:
        await admin.close()


async def _reread(b: Any, key: str, errors: list[BaseException]) -> Any:
    """The session as stored, read until a read gets through: the killer goes on while a writer checks
    what landed, and the store retries a lost read only once before it reports the server unreachable."""
    while True:
        try:
            return await b.load_session(key)
        except statekeel.BackendUnavailable as exc:
            errors.append(exc)


async def _append_until(
    store: statekeel.Store,
    key: str,
    turns: int,
    errors: list[BaseException],
    gates: dict[int, asyncio.Event] | None = None,
) -> list[str]:
    """Append ``turns`` messages one save at a time, riding out dead connections; return what was
    acknowledged (a write that raised is re-read: an unknown outcome may have landed). Before a turn
    named in ``gates``, wait for its event: the writer cannot finish before the faults it is there for."""
    b = store.backend
    acked: list[str] = []
    head = 0
    for turn in range(turns):
        if gates is not None and turn in gates:
            await gates[turn].wait()
        content = f"{key}-{turn}"
        while True:
            try:
                await b.append_messages(key, head, [message(store, content)], create=head == 0)
            except statekeel.BackendUnavailable as exc:
                errors.append(exc)
                found = await _reread(b, key, errors)
                if found is not None and found.head_seq == head + 1:
                    break  # it landed although the answer was lost
                continue  # it did not: the same conditional write again
            break
        acked.append(content)
        head += 1
    return acked


@pytest.mark.postgres
async def test_connections_killed_under_load_lose_no_acknowledged_write(pg_migrated: str) -> None:
    errors: list[BaseException] = []
    async with statekeel.open_store(pg_migrated + "?pool_max_size=6") as store:
        # Each writer waits at turns 15, 30 and 45 until the first, second and third kill happened: on
        # an idle machine the writers could otherwise finish before the third kill (seen: 2 kills).
        killed = [asyncio.Event() for _ in range(3)]
        gates = dict(zip((15, 30, 45), killed, strict=True))
        writers = [asyncio.create_task(_append_until(store, f"w{i}", 60, errors, gates)) for i in range(6)]
        kills = 0
        while not all(w.done() for w in writers) and kills < 8:
            await asyncio.sleep(0.01)
            kills += await _terminate_connections(pg_migrated) > 0
            for event in killed[:kills]:
                event.set()
        acked = await asyncio.gather(*writers)
        assert kills >= 3
        for i, written in enumerate(acked):
            rows = await store.backend.read_messages(f"w{i}")
            # Every write exactly once, in order: none lost, none doubled by a retry.
            assert [r.payload["content"] for r in rows] == written == [f"w{i}-{t}" for t in range(60)]
    assert all(isinstance(e, statekeel.BackendUnavailable) for e in errors)


# --- cancelled calls --------------------------------------------------------------------------------


async def test_a_cancelled_write_lands_whole_or_not_at_all_and_the_store_goes_on(shared_url: str) -> None:
    rng = random.Random(7)
    async with statekeel.open_store(shared_url) as store:
        b = store.backend
        head, expected = 0, []
        for n in range(40):
            pair = [message(store, f"q{n}"), message(store, f"a{n}", "assistant")]
            call = asyncio.create_task(b.append_messages("s", head, pair, create=head == 0))
            for _ in range(rng.randrange(6)):  # cancel at a different point each time
                await asyncio.sleep(0)
            call.cancel()
            try:
                await call
            except asyncio.CancelledError:
                pass
            found = await b.load_session("s")
            now = 0 if found is None else found.head_seq
            assert now in (head, head + 2), f"a cancelled write left {now - head} of its 2 messages"
            if now == head + 2:
                expected += [f"q{n}", f"a{n}"]
            head = now
        rows = await b.read_messages("s")
        assert [r.payload["content"] for r in rows] == expected
        assert [r.seq for r in rows] == list(range(len(rows)))
        # Cancelled task calls too, then normal service.
        task = await store.tasks.create("t", status="queued")
        call = asyncio.create_task(store.tasks.claim("w1"))
        await asyncio.sleep(0)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        current = await store.tasks.get(task.id)
        assert current is not None and current.status in ("queued", "running")
        assert current.version == (1 if current.status == "queued" else 2)
        await b.append_messages("s", head, [message(store, "after")], create=head == 0)
        assert (await store.audit.verify()).ok
