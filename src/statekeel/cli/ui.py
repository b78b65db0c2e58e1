"""``statekeel ui``: a read-only web page over a store (see :mod:`statekeel.ui`; needs ``statekeel[ui]``)."""

from __future__ import annotations

import asyncio
import signal

import click

from ..errors import StatekeelError
from ..store import redact_url
from .common import (
    audit_key_option,
    command_audit_key,
    command_keyring,
    failure,
    key_file_option,
    store_keys,
    store_url,
)
from .group import main


@main.command()
@click.option("--db", "url", default=None, help="Store URL (default: the group's --db, $STATEKEEL_URL).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", default=8765, show_default=True, type=click.IntRange(0, 65535), help="0: any free port."
)
@click.option(
    "--token",
    envvar="STATEKEEL_UI_TOKEN",
    default=None,
    help="Every request must carry it (Authorization: Bearer T, or ?token=T); required with a --host "
    "other than the loopback interface. Also read from $STATEKEEL_UI_TOKEN.",
)
@click.option(
    "--root",
    "--files-root",
    "root",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="The directory the file ledger's paths are relative to: the files page and the recovery report "
    "compare each recorded file with its copy under it (changed, missing, unchanged).",
)
@key_file_option
@audit_key_option
@click.pass_context
def ui(
    ctx: click.Context,
    url: str | None,
    key_file: str | None,
    host: str,
    port: int,
    token: str | None,
    root: str | None,
) -> None:
    """Serve a read-only page of the store: sessions and transcripts (usage, branches, traces), tasks,
    workflows, traces, LangGraph threads, memories, the file ledger, vectors, approvals, the audit log
    and the recovery report. The store is opened with migrate=False and never written.

    An encrypted store's transcripts, memories and approval arguments need its keys (--key-file); with
    its audit key (--audit-key-file) the audit page and the recovery report check the chain's MACs too.
    With --root, recorded files are compared with the files under it (drift)."""
    try:
        from ..ui import serve
    except ImportError as exc:
        click.echo(f"statekeel ui needs the ui extra: pip install 'statekeel[ui]' ({exc})", err=True)
        ctx.exit(1)
    url = store_url(url)  # the commands' check: the same error for the same URL
    keys = store_keys(key_file)

    def ready(address: str) -> None:
        click.echo(f"statekeel ui: {redact_url(url)} at {address}" + (" (token required)" if token else ""))

    # uvicorn stops gracefully on SIGTERM, then raises the signal again: make that a KeyboardInterrupt, as
    # for Ctrl-C, so that the store is closed and the command exits 0.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        asyncio.run(
            serve(
                url,
                host=host,
                port=port,
                token=token,
                on_ready=ready,
                encryption_key=keys,
                audit_key=command_audit_key(),
                keyring=command_keyring(keys),
                files_root=root,
            )
        )
    except (StatekeelError, OSError) as exc:
        # As every command says it (the opener's errors read the same as theirs), on one line.
        raise failure(exc, f"cannot serve {redact_url(url)}") from None
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
