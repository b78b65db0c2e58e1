"""The two-phase step journal, shared by task steps (``tasks.step``) and sessions' tool calls
(``sessions.run_tool``).

A step's *started* record is committed before its function runs, and its outcome after: a crash in
between leaves a record that says the function may have run, so the step is *in doubt* — run again only
when the caller said it is idempotent, otherwise surfaced (``StepInDoubt``) for the caller to settle —
and never silently run twice. What a record is and where it lives is the journal's (:class:`Step`);
the order of the phases is :func:`run_step`'s.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from .codec import Codec
from .errors import InvalidArgument, StepInTransaction

R = TypeVar("R")

StepFn = Callable[[], Any] | Awaitable[Any]

# A failed step's recorded message is cut to this many characters: the error must always be storable, or
# a step whose outcome is known (it raised) would be left in doubt and the caller's exception replaced.
MAX_ERROR_MESSAGE_CHARS = 4096


class Step(Protocol[R]):
    """One step of a journal: how it is recorded in each phase."""

    async def begin(self) -> tuple[R, bool]:
        """Commit the *started* record (or find the step's record); ``(record, run)``: run the function?"""
        ...

    def recorded(self, record: R) -> Any:
        """The outcome of a step that is not run: its recorded result, or ``StepInDoubt``."""
        ...

    async def failed(self, record: R, error: bytes) -> None:
        """The function raised: record ``error`` (an encoded :func:`error_record`)."""
        ...

    async def succeeded(self, record: R, value: Any) -> Any:
        """The function returned ``value``: commit it; return what the step returns."""
        ...


def error_record(exc: BaseException) -> dict[str, Any]:
    """What a journal stores of a step's exception: its type and (cut) message."""
    try:
        message = str(exc)
    except Exception as str_exc:  # a broken __str__ must not hide the step's real outcome
        message = f"<str() of the exception raised {type(str_exc).__name__}>"
    if len(message) > MAX_ERROR_MESSAGE_CHARS:
        message = f"{message[:MAX_ERROR_MESSAGE_CHARS]}… ({len(message)} characters, truncated)"
    return {"type": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": message}


def discard(fn: Any) -> None:
    """Close ``fn`` if it is a coroutine that will not run (Python warns about one never awaited)."""
    if inspect.iscoroutine(fn):
        fn.close()


def check_fn(fn: Any, **fields: Any) -> None:
    """Refuse an ``fn`` that is neither a callable nor an awaitable."""
    if not callable(fn) and not inspect.isawaitable(fn):
        raise InvalidArgument(f"fn must be a callable or an awaitable, got {type(fn).__name__}", **fields)


def check_outside_transaction(in_block: bool, what: str, **fields: Any) -> None:
    """Refuse a step inside the caller's ``atomic()`` block (:class:`StepInTransaction`): its *started*
    record must commit on its own before the function runs — a rollback of the block would erase it and
    let the next call run the function again — and no lock of the block may be held while it runs."""
    if in_block:
        raise StepInTransaction(
            f"{what} cannot run inside an atomic() block: its started record would commit only with the "
            "block (a rollback would erase it and the next call would run the function again) and the "
            "block would hold its locks while the function runs; call it outside the block",
            **fields,
        )


async def run_step(step: Step[R], fn: StepFn, codec: Codec) -> Any:
    """Run ``fn`` (a callable, sync or async, or an awaitable) as ``step``: *started* committed first, then
    ``fn``, then its outcome. An exception of ``fn`` is recorded and raised; a cancellation is not recorded
    (the step stays *started*: its outcome is unknown)."""
    try:
        record, run = await step.begin()
    except BaseException:
        discard(fn)
        raise
    if not run:
        discard(fn)
        return step.recorded(record)
    try:
        value = fn() if callable(fn) else fn
        if inspect.isawaitable(value):
            value = await value
    except Exception as exc:
        await step.failed(record, codec.encode(error_record(exc), where="error"))
        raise
    return await step.succeeded(record, value)


__all__ = [
    "MAX_ERROR_MESSAGE_CHARS",
    "Step",
    "StepFn",
    "check_fn",
    "check_outside_transaction",
    "discard",
    "error_record",
    "run_step",
]
