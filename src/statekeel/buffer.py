"""The buffered tier's mechanism: a bounded in-memory queue written in batches by one background task.

``put`` is a plain call that never waits and never raises: the item joins the queue (from the event
loop's thread or any other). One task writes the queue in order, a batch per transaction: at most
``interval`` seconds after an item arrives, at once when ``batch_size`` items wait, when ``flush()`` asks
and when the buffer closes. When ``capacity`` items (or ``max_bytes``) wait, the oldest are dropped and
counted; the count goes to storage with the next batch that is written.

A batch that fails stays queued (still bounded) and is retried with a growing pause; ``flush()`` raises
its error to the caller. A batch whose write is cancelled midway is written again, so a write must be
idempotent (traces upsert). The task is started in a fresh ``contextvars.Context``: it never joins the
``atomic()`` block of the code that happened to put the first item.

    buffer = WriteBuffer(write_batch, name="spans")
    buffer.put(item, size=120)
    await buffer.flush()       # every item put before this call is written (or was dropped)
    await buffer.close()
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from .errors import BackendUnavailable, InvalidArgument, StatekeelError
from .validation import check_int

log = logging.getLogger("statekeel.buffer")

T = TypeVar("T")
# write(items, dropped): store the items, in order, and add ``dropped`` to the stored overflow count, in
# one transaction.
WriteBatch = Callable[[list[T], int], Awaitable[None]]

DEFAULT_CAPACITY = 10_000
DEFAULT_BATCH_SIZE = 1_000
DEFAULT_INTERVAL_S = 0.1
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
_MAX_BACKOFF_S = 5.0


class WriteBuffer(Generic[T]):
    """A bounded queue of items written in order by one background task (see the module docstring)."""

    def __init__(
        self,
        write: WriteBatch[T],
        *,
        name: str,
        capacity: int = DEFAULT_CAPACITY,
        batch_size: int = DEFAULT_BATCH_SIZE,
        interval: float = DEFAULT_INTERVAL_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        check_int(capacity, "capacity", minimum=1)
        check_int(batch_size, "batch_size", minimum=1)
        check_int(max_bytes, "max_bytes", minimum=1)
        if type(interval) not in (int, float) or not 0 < interval <= 60:
            raise InvalidArgument(f"interval must be a number of seconds in (0, 60], got {interval!r}")
        self.name = name
        self.capacity = capacity
        self.batch_size = batch_size
        self.interval = float(interval)
        self.max_bytes = max_bytes
        self._write = write
        # (seq, item, size) in put order; touched under _lock (put may come from any thread).
        self._items: deque[tuple[int, T, int]] = deque()
        self._lock = threading.Lock()
        self._seq = 0  # the seq of the last item put
        self._bytes = 0
        self._dropped = 0  # every item dropped by this buffer
        self._unreported = 0  # dropped, not yet handed to a write
        self._inflight_first: int | None = None  # seq of the first item of the batch being written
        self._inflight_count = 0
        self._inflight_dropped = 0
        self._closed = False
        self._dropped_after_close = 0
        # Event loop side: only touched on the loop's thread.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # there is something to write
        self._now = asyncio.Event()  # write without waiting for more (a full batch, flush, close)
        self._stopping = False
        self._final_error: BaseException | None = None
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        try:  # made on the loop (as a store is): items put from other threads reach it from the start
            self._bind(asyncio.get_running_loop())
        except RuntimeError:
            pass

    # --- any thread ---------------------------------------------------------------------------------

    def put(self, item: T, size: int = 0) -> None:
        """Queue ``item`` (``size`` bytes towards ``max_bytes``). Never waits; never raises."""
        evicted = 0
        with self._lock:
            if self._closed:
                self._dropped += 1
                closed = True
            else:
                closed = False
                items = self._items
                while items and (len(items) >= self.capacity or self._bytes + size > self.max_bytes):
                    self._bytes -= items.popleft()[2]
                    evicted += 1
                self._seq += 1
                items.append((self._seq, item, size))
                self._bytes += size
                count = len(items)
                if evicted:
                    self._dropped += evicted
                    self._unreported += evicted
                    first_drop = self._unreported == evicted
        if closed:
            if self._dropped_after_close == 0:
                log.warning("%s buffer is closed: items put after close are dropped", self.name)
            self._dropped_after_close += 1
            return
        if evicted and first_drop:
            log.warning(
                "%s buffer is full (%d items): dropping the oldest until a write succeeds",
                self.name,
                self.capacity,
            )
        if count == 1 or count == self.batch_size:
            self._poke(now=count >= self.batch_size)

    @property
    def dropped(self) -> int:
        """Items this buffer dropped (full, or put after close)."""
        return self._dropped

    @property
    def unreported(self) -> int:
        """Items dropped whose count is not in storage yet."""
        with self._lock:
            return self._unreported + self._inflight_dropped

    @property
    def pending(self) -> int:
        """Items not written yet (queued or being written)."""
        with self._lock:
            return len(self._items) + self._inflight_count

    def _poke(self, *, now: bool) -> None:
        loop = self._loop
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop in this thread yet: written at the next flush()
            self._bind(loop)
        if threading.get_ident() == self._loop_thread:
            self._signal(now)
        else:
            try:
                loop.call_soon_threadsafe(self._signal, now)
            except RuntimeError:  # the loop is closed: flush() or close() writes what is left
                pass

    # --- event loop side ----------------------------------------------------------------------------

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()

    def _signal(self, now: bool) -> None:
        if (self._task is None or self._task.done()) and not self._stopping:
            assert self._loop is not None
            # A fresh context: the task must never run inside the atomic() block of whoever put first.
            self._task = self._loop.create_task(self._run(), context=contextvars.Context())
        self._wake.set()
        if now:
            self._now.set()

    def _done_upto(self) -> int:
        """Every item with a seq up to this one is written or dropped. Under ``_lock``."""
        firsts = [
            s for s in (self._inflight_first, self._items[0][0] if self._items else None) if s is not None
        ]
        return min(firsts) - 1 if firsts else self._seq

    async def flush(self) -> None:
        """Wait until every item put before this call is written (or was dropped); raise the error of a
        write that failed (the items stay queued and are retried)."""
        if self._loop is None:
            self._bind(asyncio.get_running_loop())
        with self._lock:
            target = self._seq
            if self._done_upto() >= target:
                return
        if self._stopping:
            raise BackendUnavailable(f"the {self.name} buffer is closed")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((target, waiter))
        self._signal(True)
        await waiter

    def _settle_waiters(self, error: BaseException | None) -> None:
        with self._lock:
            done = self._done_upto()
        keep: list[tuple[int, asyncio.Future[None]]] = []
        for target, waiter in self._waiters:
            if waiter.done():
                continue
            if target <= done:
                waiter.set_result(None)
            elif error is not None:
                waiter.set_exception(error)
            else:
                keep.append((target, waiter))
        self._waiters = keep

    async def _drain(self) -> None:
        """Write every queued item, a batch at a time; on failure requeue the batch and raise."""
        while True:
            with self._lock:
                if not self._items:
                    return
                count = min(self.batch_size, len(self._items))
                batch = [self._items.popleft() for _ in range(count)]
                self._bytes -= sum(b[2] for b in batch)
                self._inflight_first = batch[0][0]
                self._inflight_count = count
                dropped, self._unreported = self._unreported, 0
                self._inflight_dropped = dropped
            try:
                await self._write([b[1] for b in batch], dropped)
            except Exception as exc:
                self._requeue(batch, dropped)
                self._settle_waiters(exc)
                raise
            except BaseException:  # cancelled: the items are written later (upserts may repeat)
                self._requeue(batch, dropped)
                raise
            with self._lock:
                self._inflight_first = None
                self._inflight_count = 0
                self._inflight_dropped = 0
            self._settle_waiters(None)

    def _requeue(self, batch: list[tuple[int, T, int]], dropped: int) -> None:
        # Back at the front, in order; still bounded: the oldest go first.
        with self._lock:
            self._inflight_first = None
            self._inflight_count = 0
            self._inflight_dropped = 0
            self._items.extendleft(reversed(batch))
            self._bytes += sum(b[2] for b in batch)
            self._unreported += dropped
            while len(self._items) > self.capacity or (len(self._items) > 1 and self._bytes > self.max_bytes):
                self._bytes -= self._items.popleft()[2]
                self._dropped += 1
                self._unreported += 1

    async def _run(self) -> None:
        failures = 0
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._now.is_set() and len(self._items) < self.batch_size:
                # Gather more for up to ``interval``: the first item waits no longer than that.
                try:
                    await asyncio.wait_for(self._now.wait(), self.interval)
                except TimeoutError:
                    pass
            self._now.clear()
            try:
                await self._drain()
            except Exception as exc:
                failures += 1
                if self._stopping:
                    self._final_error = exc
                    return
                pause = min(self.interval * 2**failures, _MAX_BACKOFF_S)
                log.warning(
                    "writing %d buffered %s failed (%s); retrying in %.2f s",
                    self.pending,
                    self.name,
                    exc,
                    pause,
                )
                try:  # a flush() or close() retries at once
                    await asyncio.wait_for(self._now.wait(), pause)
                except TimeoutError:
                    pass
                self._wake.set()
                continue
            failures = 0
            if self._stopping:
                return
            if self._items:
                self._wake.set()

    async def close(self) -> None:
        """Write what is queued and stop the task. Idempotent. If the last write fails, the items still
        queued are lost: they are counted as dropped and ``BackendUnavailable`` says how many."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._loop is None:
            self._bind(asyncio.get_running_loop())
        self._stopping = True
        for _ in range(2):  # a second time when the task was cancelled (with its loop's other tasks)
            task = self._task
            if task is None or task.done():
                if not self._items:
                    break
                task = self._task = asyncio.get_running_loop().create_task(
                    self._run(), context=contextvars.Context()
                )
            self._wake.set()
            self._now.set()
            await asyncio.wait({task})
            if not task.cancelled():
                break
        with self._lock:
            lost = len(self._items)
            self._items.clear()
            self._bytes = 0
            self._dropped += lost
        error = self._final_error
        for _, waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(BackendUnavailable(f"the {self.name} buffer closed before the write"))
        self._waiters = []
        if lost:
            cause = f": {error}" if error is not None else ""
            raise BackendUnavailable(
                f"{lost} buffered {self.name} could not be written before close and are lost{cause}",
                lost=lost,
            ) from (error if isinstance(error, StatekeelError) else None)


__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_CAPACITY", "DEFAULT_INTERVAL_S", "DEFAULT_MAX_BYTES", "WriteBuffer"]
