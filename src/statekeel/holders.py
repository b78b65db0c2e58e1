"""Who holds a lease, and whether that process is known to be dead.

A lease owner id names the host, the PID namespace, the PID and the process's start time (plus a random
part, unique per manager). When a lease's holder ran on this host, in this PID namespace, and no process
with that PID and start time exists any more, the holder is dead for certain and its lease can be taken
over at once instead of after its expiry (a restarted agent then resumes its sessions immediately). On any
other host, or when this cannot be read (not Linux, another container), nothing is assumed: the lease
expires as usual.
"""

from __future__ import annotations

import os
import secrets
import socket
from functools import cache

_SEP = "|"


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after its closing one.
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


@cache
def _identity(pid: int) -> tuple[str, str, int, str]:
    return socket.gethostname(), _pid_namespace(), pid, _start_time(pid) or ""


def _this_process() -> tuple[str, str, int, str]:
    return _identity(os.getpid())  # keyed by pid: a forked child gets its own


def new_owner_id() -> str:
    """A lease owner id for one manager of this process."""
    host, ns, pid, start = _this_process()
    return _SEP.join((host, ns, str(pid), start, secrets.token_hex(4)))


def holder_is_dead(owner: str | None) -> bool:
    """True only when ``owner`` is a process of this host and PID namespace that no longer runs."""
    if not owner:
        return False
    parts = owner.split(_SEP)
    if len(parts) != 5:
        return False
    host, ns, pid_text, start, _ = parts
    here_host, here_ns, _, _ = _this_process()
    if host != here_host or not ns or ns != here_ns or not pid_text.isdigit() or not start:
        return False
    current = _start_time(int(pid_text))
    return current is None or current != start
