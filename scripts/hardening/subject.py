"""What the long checks (make fuzz, make soak) share: the server they run against and how they report.

Either `make serve`'s server (--running: config.properties and key_file.json, or --config/--key-file) or a
throwaway TorchServe with every model's archive on free ports, stopped afterwards (as verify and bench do).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from models import registry
from scripts import cli
from scripts.layout import MODEL_STORE, ROOT
from scripts.server.endpoints import Endpoints


@dataclass(frozen=True)
class Subject:
    """The server under check: its config.properties, and its addresses and tokens (the key_file.json it wrote)."""

    config: Path
    endpoints: Endpoints  # where clients connect: the front door
    logs: Path  # the logs/ folder the server writes into

    @property
    def torchserve(self) -> Endpoints:
        """TorchServe's own listeners, behind the front door."""
        return Endpoints.from_config(self.config, self.endpoints.key_file, direct=True)


class Report(Protocol):
    failures: list[str]

    def text(self) -> str: ...

    def as_dict(self) -> dict: ...


def add_options(parser: argparse.ArgumentParser, report: Path) -> None:
    parser.add_argument("--running", action="store_true", help="check the server of --config/--key-file instead of starting one")
    parser.add_argument("--report", type=Path, default=report, help="JSON report (default %(default)s)")
    cli.add_server_options(parser)


@contextlib.contextmanager
def subject(
    args: argparse.Namespace, overrides: dict[str, str] | None = None, models: tuple[str, ...] | None = None
) -> Iterator[Subject]:
    """The running server (--running), or a throwaway one serving every lane of `models` (default: every model
    in models/), from config.properties with `overrides`."""
    if args.running:
        yield Subject(args.config, Endpoints.from_config(args.config, args.key_file), ROOT / "logs")
        return
    from scripts.server.temporary import serving_in

    with tempfile.TemporaryDirectory(prefix="torchserve-check-") as folder:
        names = models if models is not None else tuple(registry.models())
        archives = {f"{name}.mar": MODEL_STORE / f"{name}.mar" for name in names}
        with serving_in(Path(folder), archives, overrides, front_door=True) as server:
            yield Subject(server.config, server.endpoints, server.workdir / "logs")


def finish(report: Report, path: Path) -> int:
    """Write the JSON report, print the text one; exit status 1 when the check failed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    print(report.text())
    return 1 if report.failures else 0
