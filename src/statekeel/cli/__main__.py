"""``python -m statekeel.cli`` runs the ``statekeel`` command."""

from __future__ import annotations

from . import main

main(prog_name="statekeel")
