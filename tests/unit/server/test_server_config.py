"""config.properties as TorchServe and our scripts read it, and the copies tests render from it."""

import json
from pathlib import Path

import pytest

from scripts.errors import ConfigError
from scripts.layout import CONFIG, ROOT
from scripts.server.config import ServerConfig, read_properties
from scripts.server.endpoints import Endpoints
from scripts.server.process import check_java


def test_config_is_secure_by_default_and_loads_both_digits_lanes():
    p = read_properties(CONFIG)
    for key in ("inference_address", "management_address", "metrics_address"):
        assert p[key].startswith("http://127.0.0.1:")
    assert p["grpc_inference_address"] == p["grpc_management_address"] == "127.0.0.1"
    assert p["disable_token_authorization"] == "false" and p["enable_model_api"] == "true"
    assert p["allowed_urls"] == "" and p["metrics_mode"] == "prometheus"
    assert {"digits", "digits-bulk"} <= set(ServerConfig.read().lanes())


def test_lanes_batch_differently_from_one_archive():
    models = json.loads(read_properties(CONFIG)["models"])
    stream, bulk = models["digits"]["1.0"], models["digits-bulk"]["1.0"]
    assert stream["marName"] == bulk["marName"] == "digits.mar"
    assert stream["maxBatchDelay"] < bulk["maxBatchDelay"] and stream["batchSize"] > bulk["batchSize"]


def test_rendered_config_moves_ports_and_store_and_keeps_the_rest(tmp_path):
    ports = {
        "inference": 18080,
        "management": 18081,
        "metrics": 18082,
        "grpc_inference": 17070,
        "grpc_management": 17071,
        "workers": 19000,
    }
    out = ServerConfig.read().render(tmp_path / "c.properties", tmp_path / "store", ports, {"load_models": "digits=digits.mar"})
    p = read_properties(out)
    e = Endpoints.from_config(out, tmp_path / "key_file.json")
    assert (e.inference, e.management, e.metrics) == (
        "http://127.0.0.1:18080",
        "http://127.0.0.1:18081",
        "http://127.0.0.1:18082",
    )
    assert (e.grpc_inference_port, e.grpc_management_port) == (17070, 17071)
    assert p["model_store"] == str(tmp_path / "store") and p["initial_worker_port"] == "19000"
    assert p["load_models"] == "digits=digits.mar"
    assert json.loads(p["models"]) == json.loads(read_properties(CONFIG)["models"])
    # TorchServe resolves metrics_config from the folder it starts in: the copy names the repository's file.
    assert p["metrics_config"] == str(ROOT / "monitoring" / "metrics.yaml") and Path(p["metrics_config"]).is_file()


def test_missing_java_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(ConfigError, match="apt-get install openjdk-17-jre-headless"):
        check_java()


def test_a_test_server_can_load_only_one_archives_lanes():
    from scripts.server.temporary import only_lanes_of

    assert only_lanes_of("digits.mar") == {"load_models": "digits=digits.mar,digits-bulk=digits.mar"}
    assert only_lanes_of("minilm.mar") == {"load_models": "minilm=minilm.mar,minilm-bulk=minilm.mar"}
    with pytest.raises(ConfigError, match="loads no lane from other.mar"):
        only_lanes_of("other.mar")


def test_config_gives_limits_and_the_model_store():
    config = ServerConfig.read()
    assert config.max_request_size == int(read_properties(CONFIG)["max_request_size"])
    assert config.model_store == CONFIG.parent / "model_store"


def test_a_missing_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        ServerConfig.read(tmp_path / "nope.properties")


def test_rendered_config_points_the_jvm_at_the_projects_log4j2_config_absolutely(tmp_path):
    # TorchServe's JVM resolves a relative path from the folder it starts in: a test server's, not the repository.
    config = ServerConfig.read()
    assert "-Dlog4j.configurationFile=monitoring/log4j2.xml" in config.get("vmargs", "")
    ports = {
        name: 1000 + n
        for n, name in enumerate(("inference", "management", "metrics", "grpc_inference", "grpc_management", "workers"))
    }
    out = ServerConfig.read(config.render(tmp_path / "c.properties", tmp_path / "store", ports))
    flags = out.get("vmargs", "").split()
    assert f"-Dlog4j.configurationFile={ROOT / 'monitoring' / 'log4j2.xml'}" in flags
    assert "-XX:+ExitOnOutOfMemoryError" in flags and (ROOT / "monitoring" / "log4j2.xml").is_file()
