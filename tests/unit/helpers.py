"""Helpers shared by the unit tests."""

from __future__ import annotations

import pytest

from swarm.cli import main


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``swarm ARGS`` in-process: its exit status, stdout and stderr."""
    try:
        code = main(args)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
