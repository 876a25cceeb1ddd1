"""A throwaway TorchServe for `make verify` and `make bench`: one archive under the repository's lanes,
on free ports, in a temporary folder, stopped on the way out (also on errors or Ctrl-C)."""
from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from scripts.endpoints import CONFIG, read_properties
from scripts.serve import lanes
from scripts.ts_server import Server, free_ports, render_config


@contextlib.contextmanager
def temporary_server(archive: Path, name: str = "digits.mar") -> Iterator[Server]:
    """Serve `archive` as model_store/`name` under the lanes config.properties gives that file (and no others)."""
    with tempfile.TemporaryDirectory(prefix="torchserve-") as folder:
        workdir = Path(folder)
        store = workdir / "model_store"
        store.mkdir()
        shutil.copy2(archive, store / name)
        config = render_config(workdir / "config.properties", store, free_ports(), {"load_models": _load_models(name)})
        server = Server(config=config, workdir=workdir, model_store=store)
        process = server.start(foreground=True)
        try:
            server.wait_ready(lanes(config), process=process)
            yield server
        finally:
            server.stop(process)


def _load_models(name: str) -> str:
    """config.properties' load_models, cut down to the lanes served from `name` (digits, digits-bulk)."""
    entries = [entry for entry in read_properties(CONFIG).get("load_models", "").split(",") if entry.partition("=")[2] == name]
    if not entries:
        raise SystemExit(f"{CONFIG} loads no lane from {name}: add it to load_models (e.g. load_models=digits={name},...)")
    return ",".join(entries)
