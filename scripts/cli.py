"""What every command line shares: the --config/--key-file options and turning typed errors into an exit status."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from handlers.errors import SettingsError
from scripts.errors import ScriptError
from scripts.layout import CONFIG, KEY_FILE

EXIT_ERROR = 1


def parser_for(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser whose help is the command module's docstring, as written."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """--config and --key-file: which running TorchServe a command talks to (default: `make serve`'s)."""
    parser.add_argument("--config", type=Path, default=CONFIG, help="config.properties the server runs with")
    parser.add_argument("--key-file", type=Path, default=KEY_FILE, help="TorchServe's key_file.json (default: repository root)")


def run(main: Callable[[], int | None], prefix: str = "error") -> None:
    """Call a command's main() and exit with its status; a typed error becomes one line on stderr and status 1."""
    try:
        status = main()
    except (ScriptError, SettingsError) as error:
        print(f"{prefix}: {error}", file=sys.stderr)
        status = EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        status = 130
    sys.exit(status or 0)
