"""The adapters' one thin bridge between event loops and threads.

A statekeel store belongs to the event loop that opened it (its locks, connections and background tasks
do). Frameworks call their session or checkpointer from anywhere: ``Runner.run_sync`` and
``graph.invoke`` from plain threads, ``asyncio.run`` in worker threads, each with a loop of its own.
:class:`LoopThread` is an event loop on a daemon thread of its own that a store opened by an adapter lives
on; :func:`on_loop` runs a coroutine on a store's loop from any thread or loop, and refuses at once, never
hangs, where that cannot work.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from ..errors import SyncCallRefused

T = TypeVar("T")


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class LoopThread:
    """An event loop running on a daemon thread of its own, until :meth:`stop`."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    def in_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def stop(self) -> None:
        """Stop the loop and wait for its thread (from any other thread; on the loop's own thread, only
        ask it to stop)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not self.in_thread():
            self._thread.join()


def submit(
    coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop, what: str
) -> concurrent.futures.Future[T]:
    """Start ``coro`` on ``loop`` from another thread; :class:`SyncCallRefused` (and ``coro`` closed) when
    ``loop`` is closed or not running, where the call would wait forever."""
    if loop.is_closed() or not loop.is_running():
        coro.close()
        raise SyncCallRefused(
            f"{what}: the event loop its store runs on is {'closed' if loop.is_closed() else 'not running'}, "
            "so the call would never complete; open the store on a loop that keeps running (or let the "
            "adapter open it from a URL: it then runs on a thread of its own)"
        )
    return asyncio.run_coroutine_threadsafe(coro, loop)


async def on_loop(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop, what: str) -> T:
    """Await ``coro`` on ``loop``: directly when that is the running loop, else through the loop's thread
    (cancelling the caller cancels it there too)."""
    if running_loop() is loop:
        return await coro
    return await asyncio.wrap_future(submit(coro, loop, what))


def blocking(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop, what: str) -> T:
    """Run ``coro`` on ``loop`` and wait for it, from a thread that is not that loop's."""
    if running_loop() is loop:
        coro.close()
        raise SyncCallRefused(
            f"{what} was called on the event loop it runs on, where it would block forever; use its "
            "async form (await ...) there"
        )
    return submit(coro, loop, what).result()


__all__ = ["LoopThread", "blocking", "on_loop", "running_loop", "submit"]
