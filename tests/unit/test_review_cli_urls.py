"""A password given in the URL's query string (``?password=…``, which asyncpg accepts) is never printed.

The CLI prints the store URL in its header and error lines, and the PostgreSQL driver's errors quote
driver messages: both blanked only the ``user:password@`` form.
"""

from __future__ import annotations

from click.testing import CliRunner

from statekeel.backends.postgres.backend import PgTarget
from statekeel.cli import main, redact_url

URL = "postgresql://ada@127.0.0.1:1/none?password=s3cret&connect_timeout=2"


def test_info_never_prints_a_password_from_the_query_string() -> None:
    result = CliRunner().invoke(main, ["--db", URL, "info"])
    assert result.exit_code == 1
    assert "s3cret" not in result.output
    assert "127.0.0.1:1" in result.output


def test_redact_url_blanks_a_query_string_password_and_keeps_other_options() -> None:
    shown = redact_url(URL)
    assert "s3cret" not in shown
    assert "connect_timeout=2" in shown
    assert shown.startswith("postgresql://ada@127.0.0.1:1/none?")


def test_driver_errors_scrub_a_query_string_password() -> None:
    target = PgTarget(URL)
    assert "s3cret" not in target.scrub("FATAL: password s3cret rejected")
    assert "s3cret" not in str(target)
