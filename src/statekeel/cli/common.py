"""What every ``statekeel`` command shares: ``--db`` and ``--json``, opening a store, one-line errors."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import enum
import json
import os
import re
import stat
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import click
from rich.console import Console, HighlighterType, JustifyMethod, OverflowMethod
from rich.style import Style
from rich.text import Text

from .. import reading
from ..chain import MIN_AUDIT_KEY_BYTES
from ..codec.encryption import read_key_file
from ..errors import (
    AuditKeyRequired,
    DecryptionError,
    InvalidArgument,
    MigrationError,
    PlaintextRefused,
    StatekeelError,
)
from ..retention import Retention
from ..store import Store, resolve_url
from ..wording import counted

T = TypeVar("T")
Keys = tuple[bytes, ...]
KEY_FILE_ENV = "STATEKEEL_KEY_FILE"
AUDIT_KEY_FILE_ENV = "STATEKEEL_AUDIT_KEY_FILE"
KEYRING_ENV = "STATEKEEL_KEYRING"
_AUDIT_KEY_FILE = "statekeel.audit_key_file"  # ctx.meta (shared by the group and its command)
_AUDIT_KEY = "statekeel.audit_key"
_AUDIT_KEY_FILE_MAX_BYTES = 4096
F = TypeVar("F", bound=Callable[..., Any])


# C0 controls but tab and newline, DEL, and the C1 controls (U+0080 to U+009F: a terminal may take U+009B
# for CSI): what a terminal could act on instead of showing.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _caret(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code == 0x7F:
        return "^?"
    if code < 0x20:
        return "^" + chr(code + 0x40)
    return "M-^" + chr(code - 0x80 + 0x40)


def visible(text: str) -> str:
    """``text`` with every control character a terminal could act on (ESC and so OSC and CSI sequences,
    BEL, backspace, carriage return, the other C0 and the C1 controls) shown as ``cat -v`` shows it —
    ``^[``, ``^G``, ``^M``, ``M-^[`` — so that stored data can never move the cursor, retitle the window,
    clear the screen or hide a line. Tab and newline are kept."""
    return _CONTROL.sub(_caret, text) if _CONTROL.search(text) else text


class SafeConsole(Console):
    """A rich console that shows control characters as :func:`visible` does in every string it renders
    (a print's text, a table's cells, with or without markup): no command can send a terminal a control
    sequence that came from the store. Emoji codes are left as written (``:x:`` stays ``:x:``)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("emoji", False)
        super().__init__(**kwargs)

    def render_str(
        self,
        text: str,
        *,
        style: str | Style = "",
        justify: JustifyMethod | None = None,
        overflow: OverflowMethod | None = None,
        emoji: bool | None = None,
        markup: bool | None = None,
        highlight: bool | None = None,
        highlighter: HighlighterType | None = None,
    ) -> Text:
        return super().render_str(
            visible(text),
            style=style,
            justify=justify,
            overflow=overflow,
            emoji=emoji,
            markup=markup,
            highlight=highlight,
            highlighter=highlighter,
        )


class Failure(click.ClickException):
    """A command that could not do its job: ``Error: <one line>`` on stderr, exit 1 (control characters
    of stored data it quotes shown as :func:`visible` does)."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(visible(" ".join(message.split())))


def failure(exc: BaseException, doing: str = "") -> Failure:
    """``exc`` as a one-line :class:`Failure` naming its type (``doing`` says what was being done)."""
    prefix = f"{doing}: " if doing else ""
    extra = ""
    if isinstance(exc, DecryptionError) and exc.fields.get("kind") is None:
        # The codec's error for a sealed value read by a store opened without any key.
        return Failure(
            f"{prefix}the store holds encrypted values and no key was given: pass --key-file PATH (a file "
            f"with the store's key, 64 hex digits a line, the current key first) or set ${KEY_FILE_ENV}"
        )
    if isinstance(exc, DecryptionError):
        extra = " — a key the --key-file lacks goes on a later line of it until statekeel rotate-key has run"
    elif isinstance(exc, PlaintextRefused):
        extra = (
            " — a store written without a key is read without --key-file; to encrypt it: "
            "statekeel rotate-key --encrypt-existing"
        )
    if isinstance(exc, AuditKeyRequired):
        return Failure(
            f"{prefix}the store's audit chain is keyed and no audit key was given: pass --audit-key-file "
            f"PATH (a file with the key as hex on one line, owner-only) or set ${AUDIT_KEY_FILE_ENV}; "
            "nothing was written"
        )
    if isinstance(exc, MigrationError) and getattr(exc, "pending", None):
        if getattr(exc, "version", None) == 0:
            extra = " — statekeel migrate creates the schema"
        else:
            extra = " — to upgrade it: stop its agents, back it up (statekeel backup), then statekeel migrate"
    text = reading.error_text(exc) if isinstance(exc, StatekeelError) else f"{type(exc).__name__}: {exc}"
    return Failure(f"{prefix}{text}{extra}")


def db_option(fn: F) -> F:
    """``--db URL`` on a command; it wins over the group's ``--db`` and ``$STATEKEEL_URL``."""
    return click.option(
        "--db",
        "db",
        default=None,
        metavar="URL",
        help="Store URL (default: the group's --db, else $STATEKEEL_URL, else sqlite:///statekeel.db).",
    )(fn)


def key_file_option(fn: F) -> F:
    """``--key-file PATH``: the store's encryption keys (see :func:`store_keys`)."""
    return click.option(
        "--key-file",
        "key_file",
        default=None,
        metavar="PATH",
        help="File of the store's encryption keys, 64 hex digits a line, current first; owner-only "
        f"(chmod 600). Default: the group's --key-file, else ${KEY_FILE_ENV}, else no key.",
    )(fn)


def _remember_audit_key_file(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    # The group's option runs first, the command's after it: the command's wins.
    if value is not None:
        ctx.meta[_AUDIT_KEY_FILE] = value


def audit_key_option(fn: F) -> F:
    """``--audit-key-file PATH``: the store's audit key (see :func:`command_audit_key`)."""
    return click.option(
        "--audit-key-file",
        default=None,
        metavar="PATH",
        expose_value=False,
        callback=_remember_audit_key_file,
        help="File of the store's audit key (open_store(audit_key=...)) as hex on one line, at least "
        f"{2 * MIN_AUDIT_KEY_BYTES} digits; owner-only (chmod 600). A store whose audit chain is keyed "
        f"refuses audited writes without it. Default: the group's --audit-key-file, else "
        f"${AUDIT_KEY_FILE_ENV}, else no key.",
    )(fn)


def group_audit_key_option(fn: F) -> F:
    """The group's ``--audit-key-file PATH`` (a command's own wins)."""
    return click.option(
        "--audit-key-file",
        default=None,
        metavar="PATH",
        expose_value=False,
        callback=_remember_audit_key_file,
        show_default=f"${AUDIT_KEY_FILE_ENV}, else no key",
        help="Audit key of the store for commands that open one (a command's own --audit-key-file wins).",
    )(fn)


def store_options(fn: F) -> F:
    """``--db URL``, ``--key-file PATH`` and ``--audit-key-file PATH``: what every command that opens a
    store takes."""
    return db_option(key_file_option(audit_key_option(fn)))


def read_audit_key_file(path: str) -> bytes:
    """The audit key in the file at ``path``: hex digits on one line (``openssl rand -hex 32``; blank
    lines and ``#`` comments skipped), at least :data:`MIN_AUDIT_KEY_BYTES` bytes. The file must be a
    regular file readable by its owner only. ``InvalidArgument`` (never quoting the file) otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InvalidArgument(f"audit key file {path} does not exist", hint="") from None
    except OSError as exc:
        raise InvalidArgument(f"cannot read audit key file {path}: {exc.strerror}", hint="") from None
    try:
        st = os.fstat(fd)  # the file opened, not the path looked at earlier
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgument(f"audit key file {path} is not a regular file", hint="")
        if os.name == "posix" and st.st_mode & 0o077:
            raise InvalidArgument(
                f"audit key file {path} is readable by others than its owner (mode "
                f"{st.st_mode & 0o777:04o}): refused; run chmod 600 {path}",
                hint="",
            )
        data = os.read(fd, _AUDIT_KEY_FILE_MAX_BYTES + 1)
    finally:
        os.close(fd)
    lines = [
        line.strip()
        for line in data.decode("ascii", "replace").splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    key: bytes | None = None
    if len(data) <= _AUDIT_KEY_FILE_MAX_BYTES and len(lines) == 1:
        try:
            key = bytes.fromhex(lines[0])
        except ValueError:
            key = None
    if key is None or len(key) < MIN_AUDIT_KEY_BYTES:
        raise InvalidArgument(
            f"audit key file {path} must hold the key as hex digits on one line, at least "
            f"{2 * MIN_AUDIT_KEY_BYTES} of them (openssl rand -hex 32)",
            hint="",
        )
    return key


def command_audit_key() -> bytes | None:
    """The audit key the running command opens its store with: its ``--audit-key-file``, else the
    group's, else ``$STATEKEEL_AUDIT_KEY_FILE``, else none (also none outside a command). Read and checked
    once, before anything is opened: a bad file is a one-line :class:`Failure`."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return None
    if _AUDIT_KEY in ctx.meta:
        cached: bytes | None = ctx.meta[_AUDIT_KEY]
        return cached
    path, what = ctx.meta.get(_AUDIT_KEY_FILE), "--audit-key-file"
    if path is None and os.environ.get(AUDIT_KEY_FILE_ENV):
        path, what = os.environ[AUDIT_KEY_FILE_ENV], f"${AUDIT_KEY_FILE_ENV}"
    key = None
    if path is not None:
        try:
            key = read_audit_key_file(path)
        except StatekeelError as exc:
            raise Failure(f"{what}: {exc}") from None
    ctx.meta[_AUDIT_KEY] = key
    return key


def store_keys(key_file: str | None) -> Keys | None:
    """The keys a command opens its store with: its ``--key-file``, else the group's, else
    ``$STATEKEEL_KEY_FILE``, else none. Read and checked before anything is opened: a missing, unreadable,
    too open or malformed key file is a one-line :class:`Failure` (that never quotes the file)."""
    what = "--key-file"
    if key_file is None:
        root = click.get_current_context().find_root().obj
        key_file = (root or {}).get("key_file")
    if key_file is None and os.environ.get(KEY_FILE_ENV):
        key_file, what = os.environ[KEY_FILE_ENV], f"${KEY_FILE_ENV}"
    command_audit_key()  # the audit key file is checked before anything is opened too
    if key_file is None:
        return None
    try:
        return read_key_file(key_file)
    except StatekeelError as exc:
        raise Failure(f"{what}: {exc}") from None


def command_keyring(keys: Keys | None) -> str | None:
    """The key ring a command opens its store with (``open_store(keyring=...)``): the group's
    ``--keyring``, else ``$STATEKEEL_KEYRING``, else none — and none without keys (a store opened without
    its keys reads no sealed value, so it needs no ring)."""
    if keys is None:
        return None
    root = click.get_current_context().find_root().obj
    path: str | None = (root or {}).get("keyring") or os.environ.get(KEYRING_ENV) or None
    return path


def json_option(fn: F) -> F:
    """``--json``: print the result as JSON instead of text."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(fn)


def store_url(db: str | None, what: str = "--db") -> str:
    """The URL a command uses: its ``--db``, else the group's (which fell back to the environment), checked
    well enough to say what is wrong with it before anything connects."""
    ctx = click.get_current_context()
    root = ctx.find_root().obj
    url = resolve_url(db) if db is not None else str(root["url"] if root else resolve_url(None))
    check_url(url, what)
    return url


def check_url(url: str, what: str = "--db") -> None:
    """A :class:`Failure` for a URL that does not parse or that no command can use (the viewer's check
    too: :func:`statekeel.reading.check_url`); ``what`` names where it came from in the message."""
    try:
        reading.check_url(url, what)
    except InvalidArgument as exc:
        raise Failure(str(exc)) from None


def require_existing(url: str) -> None:
    """A :class:`Failure` when ``url`` names a SQLite file that does not exist: opening would create it."""
    try:
        reading.require_existing(url)
    except InvalidArgument as exc:
        raise Failure(str(exc)) from None


@asynccontextmanager
async def open_for_reading(
    url: str,
    keys: Keys | None = None,
    *,
    retention: Retention | None = None,
    encrypt_existing: bool = False,
) -> AsyncIterator[Store]:
    """Open an existing store with :func:`statekeel.reading.open_for_reading` (the viewer's opener),
    with its encryption ``keys`` if given and the command's audit key (:func:`command_audit_key`), and
    close it at the end of the block: its schema is never changed, by looking at it nor by a command that
    repairs or purges it."""
    store = await reading.open_for_reading(
        url,
        encryption_key=keys,
        audit_key=command_audit_key(),
        retention=retention,
        encrypt_existing=encrypt_existing,
        keyring=command_keyring(keys),
    )
    async with store:
        yield store


async def collect(items: AsyncIterator[T], limit: int | None) -> list[T]:
    """The first ``limit`` items (all of them for None) of an async iterator such as ``sessions.iter()``."""
    found: list[T] = []
    if limit is not None and limit <= 0:
        return found
    async for item in items:
        found.append(item)
        if limit is not None and len(found) >= limit:
            break
    return found


def run(coro: Coroutine[Any, Any, T], doing: str = "") -> T:
    """Run ``coro``; a statekeel or OS error becomes a one-line :class:`Failure`."""
    try:
        return asyncio.run(coro)
    except StatekeelError as exc:
        raise failure(exc, doing) from None
    except OSError as exc:
        raise failure(exc, doing) from None


UNWRAPPED_WIDTH = 1_000_000
"""The width of a console that is not a terminal and has no ``$COLUMNS``: wide enough that no line of
stored data is ever cut in two (a pipe, a file, a log keeps each line whole)."""


def output_width() -> int | None:
    """The width commands print at: the terminal's (None: rich asks it, or takes ``$COLUMNS``), and into
    a pipe or a file ``$COLUMNS`` if it is set, else :data:`UNWRAPPED_WIDTH` (no wrapping at 80
    columns)."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").strip().isdigit():
        return None
    return UNWRAPPED_WIDTH


def console() -> Console:
    """The console commands print to (no syntax highlighting, no emoji codes: values are shown as they
    are, control characters escaped — see :class:`SafeConsole`), at :func:`output_width`."""
    return SafeConsole(highlight=False, width=output_width())


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    if hasattr(value, "_asdict"):
        return value._asdict()
    raise TypeError(f"cannot show {type(value).__name__} as JSON")


def echo_json(value: Any) -> None:
    """Print ``value`` (dataclasses, datetimes … included) as indented JSON."""
    click.echo(json.dumps(value, indent=2, ensure_ascii=False, default=_plain))


def listing_console(found: list[Any], as_json: bool, empty: str) -> Console | None:
    """Print ``found`` as JSON, or ``empty`` when it is empty (None: nothing more to print); else the
    console to print its table on."""
    if as_json:
        echo_json(found)
        return None
    out = console()
    if not found:
        out.print(empty, markup=False)
        return None
    return out


def size_text(n: int) -> str:
    """``512 bytes``, ``4.1 kB``, ``12.3 MB``."""
    if n >= 1_000_000:
        return f"{n / 1e6:.1f} MB"
    return f"{n / 1e3:.1f} kB" if n >= 1000 else counted(n, "byte")
