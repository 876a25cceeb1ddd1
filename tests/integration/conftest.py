"""A real TorchServe per test session, on free ports, from a temporary folder; stopped even on failure."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from scripts.endpoints import ROOT, Endpoints
from scripts.temp_server import serving_in
from scripts.ts_server import Server


@dataclass
class RunningServer:
    server: Server
    endpoints: Endpoints
    workdir: Path
    model_store: Path


def start_server(workdir: Path, archives: list[str], overrides: dict[str, str] | None = None, models: list[str] | None = None):
    """Start TorchServe in `workdir` with copies of `archives` from model_store; yields a RunningServer."""
    with serving_in(workdir, {name: ROOT / "model_store" / name for name in archives}, overrides, models) as server:
        yield RunningServer(server, server.endpoints, workdir, server.model_store)


def two_lanes(model: str) -> dict[str, str]:
    """Overrides loading only `model`'s stream and bulk lanes (config.properties loads every model)."""
    return {"load_models": f"{model}={model}.mar,{model}-bulk={model}.mar"}


@pytest.fixture(scope="session")
def digits_server(tmp_path_factory):
    yield from start_server(tmp_path_factory.mktemp("torchserve"), ["digits.mar"], two_lanes("digits"))


@pytest.fixture(scope="session")
def minilm_server(tmp_path_factory):
    yield from start_server(tmp_path_factory.mktemp("torchserve-minilm"), ["minilm.mar"], two_lanes("minilm"))
