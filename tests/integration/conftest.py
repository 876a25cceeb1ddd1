"""A real TorchServe per test session, on free ports, from a temporary folder; stopped even on failure."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from scripts.endpoints import ROOT, Endpoints
from scripts.serve import lanes
from scripts.ts_server import Server, free_ports, render_config


@dataclass
class RunningServer:
    server: Server
    endpoints: Endpoints
    workdir: Path
    model_store: Path


def start_server(workdir: Path, archives: list[str], overrides: dict[str, str] | None = None, models: list[str] | None = None):
    """Start TorchServe in `workdir` with copies of `archives` from model_store; yields a RunningServer."""
    store = workdir / "model_store"
    store.mkdir(parents=True)
    for name in archives:
        source = ROOT / "model_store" / name
        if not source.exists():
            pytest.fail(f"{source} is missing: run `make archive` (make test does) first")
        shutil.copy2(source, store / name)
    config = render_config(workdir / "config.properties", store, free_ports(), overrides)
    server = Server(config=config, workdir=workdir, model_store=store)
    process = server.start(foreground=True)
    try:
        server.wait_ready(models if models is not None else lanes(config), process=process)
        yield RunningServer(server, server.endpoints, workdir, store)
    finally:
        server.stop(process)


def two_lanes(model: str) -> dict[str, str]:
    """Overrides loading only `model`'s stream and bulk lanes (config.properties loads every model)."""
    return {"load_models": f"{model}={model}.mar,{model}-bulk={model}.mar"}


@pytest.fixture(scope="session")
def digits_server(tmp_path_factory):
    yield from start_server(tmp_path_factory.mktemp("torchserve"), ["digits.mar"], two_lanes("digits"))


@pytest.fixture(scope="session")
def minilm_server(tmp_path_factory):
    yield from start_server(tmp_path_factory.mktemp("torchserve-minilm"), ["minilm.mar"], two_lanes("minilm"))
