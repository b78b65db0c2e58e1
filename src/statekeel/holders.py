"""Who holds a lease, and whether that process is known to be dead.

A lease owner id names the host, the PID namespace, the PID and the process's start time (plus a random
part, unique per manager). When a lease's holder ran on this host, in this PID namespace, and its death is
proven — the kernel has no process with that PID, or the process with that PID started at another time
(the PID was reused) — its lease can be taken over at once instead of after its expiry (a restarted agent
then resumes its sessions immediately). Anything unproven counts as alive: another host, another
container, or a process whose start time cannot be read (``/proc`` mounted with ``hidepid`` hides other
users' processes); such a lease expires as usual.
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


def _no_such_process(pid: int) -> bool:
    """True only when the kernel says no process has ``pid`` (signal 0 checks, and sends nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # PermissionError: it exists, as another user's process
        return False
    return False


def holder_is_dead(owner: str | None) -> bool:
    """True only when ``owner`` is a process of this host and PID namespace whose death is proven."""
    if not owner:
        return False
    parts = owner.split(_SEP)
    if len(parts) != 5:
        return False
    host, ns, pid_text, start, _ = parts
    here_host, here_ns, _, _ = _this_process()
    if host != here_host or not ns or ns != here_ns or not pid_text.isdigit() or not start:
        return False
    pid = int(pid_text)
    if pid <= 0:
        return False
    if _no_such_process(pid):
        return True
    current = _start_time(pid)
    # Unreadable (hidepid, a race with its exit): not proven, so alive. Another start time: PID reused.
    return current is not None and current != start
