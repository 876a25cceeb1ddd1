"""An image build step: bytecode for what serving imports, and for nothing else.

pip writes a .pyc for every module it installs (169 MB of the image: torch's tools, sympy's every corner,
pip itself); the Dockerfile removes them all, then runs this as root while /srv is still writable. It imports
what a TorchServe worker and the container's commands import and loads every archive in the model store as a
worker does, so Python writes the bytecode of exactly the modules serving uses. The server's user cannot
write /srv: a module imported later that this left out is compiled in memory (a slower import, never wrong).

    python -m scripts.container.precompile [--model-store model_store]
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from scripts import cli
from scripts.archive.core import load_core
from scripts.layout import MODEL_STORE

# TorchServe's worker (it imports its protocol and service modules), our handler, the container's own commands.
MODULES = (
    "ts.model_service_worker",
    "handlers.torchserve.torchserve_handler",
    "scripts.container.entrypoint",
    "scripts.container.healthcheck",
)


def precompile(model_store: Path) -> list[str]:
    """Import MODULES and load every archive in `model_store`; returns the archives' names."""
    for name in MODULES:
        importlib.import_module(name)
    loaded = []
    for archive in sorted(model_store.glob("*.mar")):
        load_core(archive)
        loaded.append(archive.name)
    return loaded


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--model-store", type=Path, default=MODEL_STORE, help="the archives to load")
    args = parser.parse_args(argv)
    loaded = precompile(args.model_store)
    cached = sum(1 for _ in Path(sys.prefix).rglob("*.pyc"))
    print(f"bytecode written for what serving imports: {cached} .pyc files; archives loaded: {', '.join(loaded)}")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
