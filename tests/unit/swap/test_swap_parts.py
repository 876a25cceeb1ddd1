"""The pieces of gRPC errors and hot-swap that need no server: error bodies, lane settings, gate checks, archives."""

from __future__ import annotations

import json
import shutil

import pytest

from handlers.errors import RequestError, out_of_resources
from models import registry
from scripts.archive.reader import DigestMismatch, MarFile
from scripts.clients.grpc_client import PredictionError, error_in, result_of
from scripts.errors import ConfigError
from scripts.layout import CONFIG, ROOT
from scripts.server.config import LaneSettings, ServerConfig
from scripts.server.endpoints import Endpoints
from scripts.server.samples_gate import GateResult, chunk_rows, probe
from scripts.swap.hot_swap import Swapper, SwapRefused
from scripts.swap.management import ManagementApi


def test_the_handlers_error_body_is_recognised_with_its_message():
    for error in (RequestError("instances[3]: expected 64 values in 0..16, got 63"), out_of_resources("too large")):
        found = error_in(json.dumps(error.to_dict()).encode())
        assert found == PredictionError(error.message, error.code, error.type)
        with pytest.raises(PredictionError, match="too large|expected 64 values"):
            result_of(json.dumps(error.to_dict()).encode())


@pytest.mark.parametrize(
    "body",
    [
        {"label": 7, "scores": [0.1] * 10},
        {"predictions": [{"label": 1, "scores": [0.1] * 10}]},
        {"code": 200, "type": "x", "message": "a result that only looks like an error"},
        {"code": 400, "type": "x", "message": "m", "label": 3},
    ],
)
def test_results_are_not_taken_for_errors(body):
    assert error_in(json.dumps(body).encode()) is None
    assert result_of(json.dumps(body).encode()) == body


def test_non_json_bodies_are_not_errors():
    assert error_in(b"\x89PNG...") is None
    assert error_in(b"{not json") is None


def test_lane_settings_come_from_config_properties():
    lanes = ServerConfig.read(CONFIG).lane_settings("digits")
    assert lanes == {
        "digits": LaneSettings(batch_size=32, max_batch_delay=1, response_timeout=30, workers=2),
        # TorchServe's wall-clock backstop (the lane's own limit counts its worker's run time: handler.response_timeout_s)
        "digits-bulk": LaneSettings(batch_size=4, max_batch_delay=50, response_timeout=7200, workers=1),
    }


def test_a_model_without_lanes_is_named_with_the_declared_ones():
    with pytest.raises(ConfigError, match="no lanes for model 'nope'.*digits"):
        ServerConfig.read(CONFIG).lane_settings("nope")


def test_a_lane_without_batching_is_refused(tmp_path):
    config = tmp_path / "config.properties"
    config.write_text('models={"digits": {"1.0": {"marName": "digits.mar", "batchSize": 4}}}\n')
    with pytest.raises(ConfigError, match="lacks maxBatchDelay, responseTimeout, minWorkers"):
        ServerConfig.read(config).lane_settings("digits")


def test_the_gate_needs_its_models_agreement_and_no_problems():
    assert GateResult("digits", "2.0", 0.95, rows=200, agreeing=196).passed
    assert not GateResult("digits", "2.0", 0.95, rows=200, agreeing=150).passed
    assert not GateResult("minilm", "2.0", 1.0, rows=16, agreeing=15).passed
    assert not GateResult("digits", "2.0", 0.95, rows=200, agreeing=200, problems=["HTTP 503: busy"]).passed
    assert not GateResult("digits", "2.0").passed
    failed = GateResult("minilm", "2.0", 1.0, rows=16, agreeing=15, disagreements=["sample 3: embedding has cosine 0.2"])
    assert "93.8% of 16 samples" in failed.summary() and "sample 3: embedding has cosine 0.2" in failed.summary()


def test_every_lane_has_a_gate_and_a_probe_from_its_models_samples():
    for lane in registry.lanes():
        found, _ = registry.lane(lane.name)
        assert json.loads(probe(lane.name)) == {"instances": [found.samples().instances[0]]}
        # A gate request never carries more rows than the lane admits (digits' stream lane: 1,024; minilm's: 32).
        assert 1 <= chunk_rows(found, lane.name) == found.handler_value("max_request_rows", lane.name)
    assert chunk_rows(registry.model("minilm"), "minilm") == 32


@pytest.fixture
def swapper(tmp_path) -> Swapper:
    store = tmp_path / "model_store"
    store.mkdir()
    source = MarFile(ROOT / "model_store" / "digits.mar")
    if not source.digest_file.exists():
        pytest.skip("model_store/digits.mar(.sha256) is not built (make archive)")
    source.copy(store / "digits.mar")
    return Swapper(Endpoints.from_config(CONFIG, tmp_path / "key_file.json"), CONFIG, store, log=lambda line: None)


def test_an_archive_is_read_from_its_manifest(swapper):
    archive = swapper.read_archive(swapper.model_store / "digits.mar", "digits")
    assert (archive.model, archive.version) == ("digits", "1.0")


def test_archive_problems_are_refused_with_what_to_do(swapper, tmp_path):
    with pytest.raises(SwapRefused, match="does not exist: build it with `make archive VERSION="):
        swapper.read_archive(swapper.model_store / "digits-7.0.mar", "digits")
    outside = tmp_path / "digits.mar"
    shutil.copy2(swapper.model_store / "digits.mar", outside)
    with pytest.raises(SwapRefused, match="not in the server's model store"):
        swapper.read_archive(outside, "digits")
    with pytest.raises(SwapRefused, match="holds model 'digits', not 'minilm'"):
        swapper.read_archive(swapper.model_store / "digits.mar", "minilm")
    (swapper.model_store / "junk.mar").write_bytes(b"not a zip")
    with pytest.raises(SwapRefused, match="not a model archive"):
        swapper.read_archive(swapper.model_store / "junk.mar", "digits")


def test_an_archive_changed_or_unrecorded_since_make_archive_is_refused(swapper):
    """Swap and register check the sha256 `make archive` recorded; nothing reaches the server (there is none)."""
    store = swapper.model_store
    tampered = MarFile(store / "digits.mar").copy(store / "digits-tampered.mar")
    data = bytearray(tampered.path.read_bytes())
    data[-100] ^= 0xFF  # in the zip's central directory: still a readable archive of digits 1.0
    tampered.path.write_bytes(bytes(data))
    expected, actual = tampered.recorded_digest(), tampered.sha256()
    changed = f"digits-tampered.mar does not match its recorded sha256: expected {expected}, actual {actual}"
    with pytest.raises(SwapRefused, match=changed):
        swapper.read_archive(tampered.path, "digits")
    unrecorded = MarFile(store / "digits.mar").copy(store / "digits-unrecorded.mar")
    unrecorded.digest_file.unlink()
    with pytest.raises(SwapRefused, match="digits-unrecorded.mar has no recorded sha256"):
        swapper.read_archive(unrecorded.path, "digits")
    lane = ServerConfig.read(CONFIG).lane_settings("digits")["digits"]
    with pytest.raises(DigestMismatch, match="digits-unrecorded.mar has no recorded sha256"):
        ManagementApi(swapper.endpoints).register("digits", unrecorded.path, lane)
    assert swapper.read_archive(store / "digits.mar", "digits").version == "1.0"


def test_rollback_without_a_recorded_swap_says_so(swapper):
    with pytest.raises(SwapRefused, match="no recorded swap of 'digits'"):
        swapper.rollback("digits")
