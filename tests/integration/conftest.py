"""A real TorchServe per test session, on free ports, from a temporary folder; stopped even on failure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from models import registry
from scripts.layout import MODEL_STORE
from scripts.server.endpoints import Endpoints
from scripts.server.process import Server
from scripts.server.temporary import only_lanes_of, serving_in


@dataclass
class RunningServer:
    server: Server
    endpoints: Endpoints
    workdir: Path
    model_store: Path


def start_server(
    workdir: Path,
    archives: list[str],
    overrides: dict[str, str] | None = None,
    models: list[str] | None = None,
    front_door: bool = False,
):
    """Start TorchServe in `workdir` with copies of `archives` from model_store; yields a RunningServer."""
    with serving_in(workdir, {name: MODEL_STORE / name for name in archives}, overrides, models, front_door) as server:
        yield RunningServer(server, server.endpoints, workdir, server.model_store)


# The session's servers, one a model of models/ (the fixture <model>_server, made below from the folders: a new
# model's folder brings its own), stand behind the front door, as `make serve`'s does: their endpoints are the front
# door's, `server.torchserve_endpoints` TorchServe's own.
def _server_fixture(model: str):
    @pytest.fixture(scope="session", name=f"{model}_server")
    def fixture(tmp_path_factory):
        archive = f"{model}.mar"
        if not (MODEL_STORE / archive).exists():
            pytest.fail(f"model_store/{archive} is built by `make archive` (make test builds it first)")
        workdir = tmp_path_factory.mktemp(f"torchserve-{model}")
        yield from start_server(workdir, [archive], only_lanes_of(archive), front_door=True)

    return fixture


for _model in registry.models():
    globals()[f"{_model}_server"] = _server_fixture(_model)


def model_server(request: pytest.FixtureRequest, model: str) -> RunningServer:
    """The session's server of `model` (the fixture <model>_server: every model in models/ has one)."""
    return request.getfixturevalue(f"{model}_server")
