"""The serving image without building it: hadolint at warning level, the Dockerfile's contract with
scripts/container/, the container's config.properties and the pip settings a build is given.
The image itself is built and run by `make image-test` (scripts/image_check/image_test.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from models import registry
from scripts.container.config import KEY_DIR, listener_environment, ports_of, render_container_config
from scripts.container.healthcheck import inference_address, ping_url
from scripts.image_check.pip_settings import PipSettings, named_paths, parse_config_list
from scripts.layout import CONFIG, ROOT
from scripts.server.config import ServerConfig
from scripts.server.front_door import front_door_addresses, torchserve_addresses
from scripts.server.process import BIN

DOCKERFILE = ROOT / "Dockerfile"


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "hadolint"), "--failure-threshold", "warning", str(path)], capture_output=True, text=True, timeout=60
    )


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_dockerfile_is_hadolint_clean_at_warning_level():
    done = hadolint(DOCKERFILE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""


def test_hadolint_does_fail_a_bad_dockerfile(tmp_path):
    # The check above can fail: unpinned packages, root, a latest tag are warnings or worse.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\nCMD python\n")
    done = hadolint(bad)
    assert done.returncode == 1
    assert "DL3007" in done.stdout and "DL3008" in done.stdout


def test_dockerfile_runs_the_server_as_a_non_root_user_under_tini_with_the_key_volume():
    steps = instructions()
    assert steps[0] == ("ARG", "BASE=python:3.11-slim-bookworm")
    # Two stages on the same base: a jlinked Java runtime, then the image, which takes only that runtime.
    assert [args for name, args in steps if name == "FROM"] == ["${BASE} AS java", "${BASE}"]
    assert ("COPY", "--from=java /opt/java /opt/java") in steps and ("ENV", "JAVA_HOME=/opt/java") in steps
    user = [args for name, args in steps if name == "USER"]
    assert user and user[-1].split(":")[0] not in ("0", "root")
    assert ("VOLUME", f'["{KEY_DIR}"]') in steps
    assert dict(steps)["ENTRYPOINT"] == '["/usr/bin/tini", "--"]'
    command = dict(steps)["CMD"]
    assert "scripts.container.entrypoint" in command and f'"--key-dir", "{KEY_DIR}"' in command
    assert "scripts.container.healthcheck" in dict(steps)["HEALTHCHECK"]


def test_container_config_puts_the_front_door_on_all_interfaces_and_torchserve_on_loopback(tmp_path):
    repository = ServerConfig.read(CONFIG)
    container = ServerConfig.read(render_container_config(tmp_path / "config.container.properties"))
    assert container.get("inference_address", "") == f"http://127.0.0.1:{ports_of(repository)['inference']}"
    assert container.get("management_address", "") == f"http://127.0.0.1:{ports_of(repository)['management']}"
    assert container.get("grpc_inference_address", "") == "127.0.0.1"
    assert ports_of(container) == ports_of(repository)
    door = front_door_addresses(container)
    assert door == {name: "0.0.0.0:" + address.rpartition(":")[2] for name, address in front_door_addresses(repository).items()}
    assert door["inference"] == "0.0.0.0:8080"  # the image's EXPOSEd ports are the front door's
    assert "EXPOSE 8080 8081 8082 7070 7071" in (ROOT / "Dockerfile").read_text()
    assert repository.get("inference_address", "").startswith("http://127.0.0.1:")
    assert all(address.startswith("127.0.0.1:") for address in front_door_addresses(repository).values())
    # Token authorization stays on; paths are absolute because the server starts in the key volume.
    assert container.get("disable_token_authorization", "") == "false"
    assert container.get("enable_envvars_config", "") == "true"
    assert all(Path(container.get(key, "")).is_absolute() for key in ("model_store", "metrics_config"))
    assert container.lanes() == repository.lanes()


def test_listener_environment_moves_every_listener_and_the_health_check_follows(tmp_path):
    ports = {"inference": 40001, "management": 40002, "metrics": 40003, "grpc_inference": 40004, "grpc_management": 40005}
    door = {"inference": 41001, "management": 41002, "metrics": 41003, "grpc_inference": 41004, "grpc_management": 41005}
    environment = listener_environment({**ports, "workers": 40006}, door)
    assert environment["TS_INFERENCE_ADDRESS"] == "http://127.0.0.1:40001"
    assert environment["TS_GRPC_MANAGEMENT_PORT"] == "40005" and environment["TS_INITIAL_WORKER_PORT"] == "40006"
    assert environment["FRONT_DOOR_INFERENCE_ADDRESS"] == "127.0.0.1:41001"
    config = ServerConfig(Path("c"), {"inference_address": "http://0.0.0.0:8080", "enable_envvars_config": "true"})
    assert ping_url(inference_address(config, environment)) == "http://127.0.0.1:40001/ping"
    assert ping_url(inference_address(config, {})) == "http://127.0.0.1:8080/ping"
    ignored = ServerConfig(Path("c"), {"inference_address": "http://0.0.0.0:8080"})
    assert inference_address(ignored, environment) == "http://0.0.0.0:8080"  # as TorchServe: variables off
    # The front door follows the same variables: its listeners and the TorchServe it forwards to.
    container = ServerConfig.read(render_container_config(tmp_path / "config.container.properties"))
    assert front_door_addresses(container, environment) == {name: f"127.0.0.1:{port}" for name, port in door.items()}
    assert torchserve_addresses(container, environment)["inference"] == "127.0.0.1:40001"
    assert torchserve_addresses(container, environment)["grpc_management"] == "127.0.0.1:40005"
    assert front_door_addresses(ignored, environment) == {}


def test_pip_settings_merge_like_pip_install_and_name_local_paths(tmp_path):
    listing = (
        "global.find-links='/srv/wheels'\n"
        "global.extra-index-url='file:///srv/index/simple https://example.org/simple'\n"
        "install.find-links='/srv/other'\n"
        "freeze.exclude='pip'\n"
        ":env:.default-timeout='180'\n"
    )
    options = parse_config_list(listing)
    assert options == {
        "find-links": "/srv/other",
        "extra-index-url": "file:///srv/index/simple https://example.org/simple",
        "default-timeout": "180",
    }
    # A PEP 503 index's pages link to files beside simple/, so its root is what the build needs.
    assert named_paths(options["extra-index-url"]) == [Path("/srv/index")]
    (tmp_path / "wheels" / "sub").mkdir(parents=True)
    (tmp_path / "ca.crt").write_text("")
    settings = PipSettings({"find-links": f"{tmp_path}/wheels {tmp_path}/wheels/sub", "cert": f"{tmp_path}/ca.crt", "x": "/nope"})
    assert settings.local_paths() == [tmp_path / "ca.crt", tmp_path / "wheels"]
    assert f"find-links = {tmp_path}/wheels {tmp_path}/wheels/sub" in settings.conf_text().splitlines()


@pytest.mark.parametrize("line", ["no equals sign", "global.cert", "nosection='x'"])
def test_pip_settings_skip_lines_that_are_not_settings(line):
    assert parse_config_list(line) == {}


def test_the_image_serves_the_tested_archives_and_builds_none():
    """No training or export in the build: the archives `make archive` built come in with their recorded sha256
    (the entry point checks them at every start), and only the serving layer of the requirements is installed."""
    text = (ROOT / "Dockerfile").read_text()
    copies = [line.split()[1:-1] for line in text.splitlines() if line.startswith(("COPY model_store/", "COPY models/"))]
    assert copies == [["models/"], ["model_store/"]]
    assert "scripts.archive.build" not in text and "make model_store" not in text
    assert "make venv-serving" in text and "requirements.txt" not in text.replace("requirements-serving.txt", "")
    # Of the model store, the default archives alone: a model's name has no "-" (models/registry.py refuses one),
    # so <model>-<version or variant>.mar is what `*-*` leaves out. Of models/, no build code: the registry and the
    # folders' YAML and JSON.
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert {"model_store/*-*.mar", "model_store/*-*.mar.sha256", "models/**/*.py", "!models/__init__.py"} <= set(ignored)
    assert ignored.index("models/**/*.py") < ignored.index("!models/registry.py")
    assert all("-" not in name for name in registry.models())


def test_the_serving_layer_holds_no_tool_or_test_package():
    serving = {
        line.split("==")[0].lower() for line in (ROOT / "requirements-serving.txt").read_text().splitlines() if "==" in line
    }
    tools = {
        "pytest",
        "ruff",
        "schemathesis",
        "flask",
        "litserve",
        "k6",
        "matplotlib",
        "ray[data]",
        "transformers",
        "scikit-learn",
    }
    assert serving & tools == set()
    assert {"torch", "torchserve", "orjson", "onnxruntime"} <= serving
    nodeps = {line.split("==")[0] for line in (ROOT / "requirements-serving-nodeps.txt").read_text().splitlines() if "==" in line}
    assert nodeps == {"nvgpu", "six", "nvidia-ml-py", "tokenizers"}
    assert "-r requirements-serving.txt" in (ROOT / "requirements.txt").read_text().splitlines()
