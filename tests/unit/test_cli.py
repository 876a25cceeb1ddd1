"""Commands turn typed errors into one line on stderr and exit status 1; library code never exits."""

from __future__ import annotations

import subprocess
import sys

import pytest

from handlers.errors import SettingsError
from scripts import cli
from scripts.errors import ConfigError
from scripts.layout import ROOT


@pytest.mark.parametrize(
    "error", [ConfigError("config.properties has no models= entry"), SettingsError("handler.task is required")]
)
def test_a_typed_error_becomes_one_line_and_status_1(error, capsys):
    def main() -> int:
        raise error

    with pytest.raises(SystemExit) as exited:
        cli.run(main)
    assert exited.value.code == 1
    assert capsys.readouterr().err == f"error: {error}\n"


def test_a_command_returns_its_own_status():
    with pytest.raises(SystemExit) as exited:
        cli.run(lambda: 3)
    assert exited.value.code == 3


def test_a_real_command_without_a_server_says_what_to_do(tmp_path):
    """The REST client against a key file that does not exist: no traceback, the hint, status 1."""
    reply = subprocess.run(
        [sys.executable, "-m", "scripts.clients.rest", "--text", "x", "--key-file", str(tmp_path / "key_file.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert reply.returncode == 1
    assert reply.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'key_file.json'} not found: start the server with `make serve` (it writes the token file there)"
    ]
