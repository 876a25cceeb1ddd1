"""A real TorchServe per test session, on free ports, from a temporary folder; stopped even on failure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

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


# The session's servers stand behind the front door, as `make serve`'s does: their endpoints are the front door's,
# `server.torchserve_endpoints` TorchServe's own.
@pytest.fixture(scope="session")
def digits_server(tmp_path_factory):
    yield from start_server(tmp_path_factory.mktemp("torchserve"), ["digits.mar"], only_lanes_of("digits.mar"), front_door=True)


@pytest.fixture(scope="session")
def minilm_server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("torchserve-minilm")
    yield from start_server(workdir, ["minilm.mar"], only_lanes_of("minilm.mar"), front_door=True)


@pytest.fixture(scope="session")
def efficientnet_lite0_server(tmp_path_factory):
    if not (MODEL_STORE / "efficientnet_lite0.mar").exists():
        pytest.skip("model_store/efficientnet_lite0.mar is built by `make archive`")
    workdir = tmp_path_factory.mktemp("torchserve-efficientnet")
    yield from start_server(workdir, ["efficientnet_lite0.mar"], only_lanes_of("efficientnet_lite0.mar"), front_door=True)


def model_server(request: pytest.FixtureRequest, model: str) -> RunningServer:
    """The session's server of `model` (the fixture <model>_server: every model in models/ has one)."""
    return request.getfixturevalue(f"{model}_server")
