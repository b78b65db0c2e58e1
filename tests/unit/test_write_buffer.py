"""The buffered tier's queue: bounded, ordered, retried after a failed write, honest about what it lost."""

from __future__ import annotations

import asyncio
import time

import pytest

import statekeel
from statekeel.buffer import WriteBuffer


class Sink:
    """A write target that can be made to fail; records every batch it accepted."""

    def __init__(self) -> None:
        self.batches: list[tuple[list[int], int]] = []
        self.failing = False
        self.calls = 0

    async def write(self, items: list[int], dropped: int) -> None:
        self.calls += 1
        await asyncio.sleep(0)
        if self.failing:
            raise statekeel.BackendUnavailable("disk unplugged")
        self.batches.append((list(items), dropped))

    @property
    def items(self) -> list[int]:
        return [i for batch, _ in self.batches for i in batch]

    @property
    def dropped(self) -> int:
        return sum(d for _, d in self.batches)


async def test_items_are_written_in_order_in_batches() -> None:
    sink = Sink()
    buffer = WriteBuffer(sink.write, name="items", batch_size=4)
    for n in range(10):
        buffer.put(n)
    await buffer.flush()
    assert sink.items == list(range(10))
    assert all(len(batch) <= 4 for batch, _ in sink.batches)
    await buffer.close()


async def test_a_failed_write_keeps_the_items_and_flush_raises_its_error() -> None:
    sink = Sink()
    buffer = WriteBuffer(sink.write, name="items", capacity=100, interval=60)
    for n in range(5):
        buffer.put(n)
    sink.failing = True
    with pytest.raises(statekeel.BackendUnavailable, match="disk unplugged"):
        await buffer.flush()
    assert buffer.pending == 5 and sink.items == []
    sink.failing = False
    await buffer.flush()
    assert sink.items == [0, 1, 2, 3, 4] and buffer.pending == 0
    await buffer.close()


async def test_the_background_task_retries_a_failed_write_by_itself() -> None:
    sink = Sink()
    sink.failing = True
    buffer = WriteBuffer(sink.write, name="items", interval=0.01)
    buffer.put(1)
    deadline = time.monotonic() + 10
    while sink.calls < 2:  # failed once, then retried after a pause
        assert time.monotonic() < deadline, "the failed write was not retried"
        await asyncio.sleep(0.01)
    sink.failing = False
    while sink.items != [1]:
        assert time.monotonic() < deadline, "the retried write never landed"
        await asyncio.sleep(0.01)
    await buffer.close()


async def test_while_writes_fail_the_buffer_stays_bounded_dropping_the_oldest() -> None:
    sink = Sink()
    sink.failing = True
    buffer = WriteBuffer(sink.write, name="items", capacity=10, interval=60)
    for n in range(25):
        buffer.put(n)
        if n % 5 == 4:
            with pytest.raises(statekeel.BackendUnavailable):
                await buffer.flush()
    assert buffer.pending == 10 and buffer.dropped == 15 and buffer.unreported == 15
    sink.failing = False
    await buffer.flush()
    assert sink.items == list(range(15, 25))
    assert sink.dropped == 15 and buffer.unreported == 0  # the count went out with the batch
    await buffer.close()


async def test_max_bytes_bounds_the_buffer_too() -> None:
    sink = Sink()
    buffer = WriteBuffer(sink.write, name="items", max_bytes=1000, interval=60)
    for n in range(10):
        buffer.put(n, size=300)
    assert buffer.pending == 3 and buffer.dropped == 7
    await buffer.flush()
    assert sink.items == [7, 8, 9]
    await buffer.close()


async def test_close_that_cannot_write_says_how_many_items_were_lost() -> None:
    sink = Sink()
    buffer = WriteBuffer(sink.write, name="items", interval=60)
    for n in range(3):
        buffer.put(n)
    sink.failing = True
    with pytest.raises(statekeel.BackendUnavailable, match="3 buffered items") as info:
        await buffer.close()
    assert info.value.lost == 3  # type: ignore[attr-defined]
    assert buffer.dropped == 3 and buffer.pending == 0
    await buffer.close()  # idempotent


async def test_items_put_before_the_buffer_knows_a_loop_are_written_by_flush() -> None:
    sink = Sink()
    # Made and filled in a thread without an event loop: nothing can schedule the writer yet.
    buffer: WriteBuffer[int] = await asyncio.to_thread(WriteBuffer, sink.write, name="items")
    await asyncio.to_thread(lambda: [buffer.put(n) for n in range(3)])
    assert buffer.pending == 3
    await buffer.flush()
    assert sink.items == [0, 1, 2]
    await buffer.close()


async def test_a_writer_task_cancelled_with_its_loop_tasks_is_replaced() -> None:
    sink = Sink()
    buffer = WriteBuffer(sink.write, name="items", interval=60)
    buffer.put(1)
    task = buffer._task
    assert task is not None
    task.cancel()  # what a loop shutting down does to every pending task
    with pytest.raises(asyncio.CancelledError):
        await task
    buffer.put(2)
    await buffer.flush()
    assert sink.items == [1, 2]
    buffer._task.cancel()  # type: ignore[union-attr]
    buffer.put(3)
    await buffer.close()  # writes what is left with a task of its own
    assert sink.items == [1, 2, 3]


@pytest.mark.parametrize(
    "options",
    [{"capacity": 0}, {"batch_size": 0}, {"max_bytes": -1}, {"interval": 0}, {"interval": "1"}],
    ids=["capacity", "batch_size", "max_bytes", "interval-0", "interval-str"],
)
def test_bad_buffer_options_are_invalid_argument(options: dict[str, object]) -> None:
    with pytest.raises(statekeel.InvalidArgument):
        WriteBuffer(Sink().write, name="items", **options)  # type: ignore[arg-type]
