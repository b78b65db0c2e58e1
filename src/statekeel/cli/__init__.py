"""The ``statekeel`` command: a thin layer over the public API.

statekeel demo                 # the crash-and-resume demo, in a fresh temporary directory
statekeel info --db sqlite:///agent.db
statekeel --db postgresql://me@db-host/agents doctor

Every command takes ``--db URL`` (also accepted before the command name; the command's own wins), else
``$STATEKEEL_URL``, else ``sqlite:///statekeel.db``. Read commands never create, migrate or change a store;
read commands print JSON with ``--json``. An encrypted store's keys are read from the file named by
``--key-file PATH`` (else ``$STATEKEEL_KEY_FILE``), never from the command line; a store whose audit
chain is keyed, its audit key from ``--audit-key-file PATH`` (else ``$STATEKEEL_AUDIT_KEY_FILE``); a
store with a key ring, its ring from ``--keyring PATH`` (else ``$STATEKEEL_KEYRING``). Errors
are one line on stderr and a non-zero exit.
"""

from __future__ import annotations

from ..store import redact_url

# Importing a command module registers its commands on ``main``.
from . import admin as _admin
from . import demo as _demo
from . import erase as _erase
from . import export as _export
from . import importing as _importing
from . import info as _info
from . import operate as _operate
from . import schedules as _schedules
from . import sessions as _sessions
from . import tasks as _tasks
from . import ui as _ui  # (imports statekeel.ui only when the command runs)
from .group import main

__all__ = ["main", "redact_url"]
del _admin, _demo, _erase, _export, _importing, _info, _operate, _schedules, _sessions, _tasks, _ui
