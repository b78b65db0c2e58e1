"""Sessions: what an agent said and heard, append-only, resumable after a crash.

async with statekeel.open_store("sqlite:///agent.db") as store:
    async with store.sessions.open("user-42") as session:   # lock + load-or-create + save on exit
        session.add_message("user", "hello")

The package: ``session`` (the in-memory :class:`Session`, which owns its bookkeeping), ``lock``
(:class:`SessionLock` and leases), ``fallback`` (fallback files written when the backend cannot take a
save, merged on load and replayed; their file format is :mod:`statekeel.fallback`), ``listing`` (the
read-only calls: ``list``, ``iter``, ``snapshot``, ``archived``) and ``manager`` (:class:`SessionManager`).
"""

from __future__ import annotations

from ..fallback import ReplayReport
from .lock import SessionLock
from .manager import SessionManager
from .session import Rewind, Session, Summary

__all__ = ["ReplayReport", "Rewind", "Session", "SessionLock", "SessionManager", "Summary"]
