"""Real expiry: a TorchServe whose keys live 1.8 seconds (token_expiration_min=0.03; TorchServe 0.12 reads
it as a double). Expired keys are refused; the management client, a batch job that lasts longer than a
key, and the gRPC client renew theirs (scripts/server/endpoints.py) and finish.

The server starts with no model (quicker) and the test registers digits-bulk itself. The job's length
does not depend on the machine's speed: one chunk at a time never fills the lane's batch of 4, so
TorchServe holds each chunk for the full maxBatchDelay (100 ms), and 25 chunks take over 2.5 seconds.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import grpc
import pytest
import requests
from google.protobuf import empty_pb2

from models.digits.samples import digit_rows, grid_png, held_out, write_jsonl
from scripts.clients.grpc_client import GrpcClient, bearer
from scripts.clients.grpc_stubs import inference_pb2_grpc
from scripts.container import healthcheck
from scripts.errors import ConfigError, ServerError
from scripts.jobs.batch_job import JobConfig, run_job
from scripts.layout import MODEL_STORE
from scripts.server.config import LaneSettings
from scripts.server.endpoints import read_key
from scripts.server.temporary import serving_in
from scripts.swap.management import ManagementApi
from tests.integration.security.test_tokens import REFUSAL

LIFETIME_MIN = "0.03"  # 1.8 s
LANE = LaneSettings(batch_size=4, max_batch_delay=100, response_timeout=60, workers=1)
CHUNKS, CHUNK_ROWS = 25, 10


@pytest.fixture(scope="module")
def expiring_server(tmp_path_factory):
    overrides = {"load_models": "", "token_expiration_min": LIFETIME_MIN}
    with serving_in(
        tmp_path_factory.mktemp("expiring"), {"digits.mar": MODEL_STORE / "digits.mar"}, overrides, models=[]
    ) as server:
        deadline = time.monotonic() + 120
        while not healthy(server.endpoints):
            assert time.monotonic() < deadline, "TorchServe did not answer /ping within 120 s"
            time.sleep(0.2)
        e = server.endpoints
        for port in (e.grpc_inference_port, e.grpc_management_port):  # gRPC comes up after REST
            with grpc.insecure_channel(f"{e.grpc_host}:{port}") as channel:
                grpc.channel_ready_future(channel).result(timeout=max(1.0, deadline - time.monotonic()))
        yield server


def healthy(endpoints) -> bool:
    try:
        return requests.get(f"{endpoints.inference}/ping", headers=endpoints.auth("inference"), timeout=5).status_code == 200
    except (requests.RequestException, ConfigError):  # not listening yet, or no key file yet
        return False


def raw_keys(server) -> dict:
    return json.loads(server.endpoints.key_file.read_text())


def wait_until_expired(server, kind: str) -> str:
    """The `kind` key the file holds now, returned once TorchServe no longer accepts it."""
    key = read_key(server.endpoints.key_file, kind)
    time.sleep(max(0.0, (key.expires - datetime.now(UTC)).total_seconds()) + 0.3)
    return key.value


def test_expired_keys_are_refused_everywhere(expiring_server):
    e = expiring_server.endpoints
    inference, management = wait_until_expired(expiring_server, "inference"), raw_keys(expiring_server)["management"]["key"]
    ping = requests.get(f"{e.inference}/ping", headers={"Authorization": f"Bearer {inference}"}, timeout=30)
    models = requests.get(f"{e.management}/models", headers={"Authorization": f"Bearer {management}"}, timeout=30)
    for reply in (ping, models):
        assert reply.status_code == 400 and reply.json()["message"] == REFUSAL
    with grpc.insecure_channel(f"{e.grpc_host}:{e.grpc_inference_port}") as channel:
        with pytest.raises(grpc.RpcError) as refused:
            inference_pb2_grpc.InferenceAPIsServiceStub(channel).Ping(empty_pb2.Empty(), metadata=bearer(inference), timeout=30)
    assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.PERMISSION_DENIED, REFUSAL)


def test_clients_renew_expired_keys_and_a_longer_batch_job_finishes(expiring_server, tmp_path):
    e = expiring_server.endpoints
    expired_management = wait_until_expired(expiring_server, "management")
    ManagementApi(e).register("digits-bulk", expiring_server.model_store / "digits.mar", LANE)
    assert raw_keys(expiring_server)["management"]["key"] != expired_management

    rows = digit_rows(CHUNKS * CHUNK_ROWS)
    first_key = read_key(e.key_file, "inference").value
    started = time.monotonic()
    summary = run_job(
        JobConfig(
            model="digits",
            input=write_jsonl(tmp_path / "rows.jsonl", rows),
            output=tmp_path / "predictions.jsonl",
            chunk_size=CHUNK_ROWS,
            concurrency=1,
            config=expiring_server.config,
            key_file=e.key_file,
            progress_bar=False,
        )
    )
    seconds = time.monotonic() - started
    assert (summary.predicted, summary.failed) == (CHUNKS * CHUNK_ROWS, 0)
    assert read_key(e.key_file, "inference").value != first_key  # the job outlived the key it started with
    stale = requests.post(
        e.prediction_url("digits-bulk"), data=b"{}", headers={"Authorization": f"Bearer {first_key}"}, timeout=30
    )
    assert stale.status_code == 400 and stale.json()["message"] == REFUSAL

    wait_until_expired(expiring_server, "inference")
    grids, labels = held_out(1)
    with GrpcClient(e) as client:
        assert client.predict("digits-bulk", grid_png(grids[0]))["label"] == labels[0]
    print(f"\nbatch job of {summary.predicted} rows over keys living {float(LIFETIME_MIN) * 60:.1f} s: {seconds:.1f} s, 0 failed")


def test_the_health_check_outlives_expired_keys_and_sees_a_lane_without_workers(expiring_server):
    """The image's HEALTHCHECK and the pod's probes (scripts/container/healthcheck.py) on this server: across
    expired keys (renewed through /token), and `--ready` fails while a lane has no worker, which /ping misses."""
    e = expiring_server.endpoints
    management = ManagementApi(e)
    if "digits-bulk" not in [entry["modelName"] for entry in management_models(e)]:
        management.register("digits-bulk", expiring_server.model_store / "digits.mar", LANE)
    for _ in range(2):  # twice: each check finds the keys the last one made expired again
        expired = wait_until_expired(expiring_server, "inference")
        wait_until_expired(expiring_server, "management")
        healthcheck.check(expiring_server.config, e.key_file, ready=True)
        assert raw_keys(expiring_server)["inference"]["key"] != expired
    scale(e, "digits-bulk", 0)
    try:
        healthcheck.check(expiring_server.config, e.key_file)  # /ping: TorchServe still says Healthy
        with pytest.raises(ServerError, match="lane\\(s\\) without a READY worker: digits-bulk"):
            healthcheck.check(expiring_server.config, e.key_file, ready=True)
    finally:
        scale(e, "digits-bulk", 1)
    healthcheck.check(expiring_server.config, e.key_file, ready=True)


def management_models(endpoints) -> list[dict]:
    reply = requests.get(f"{endpoints.management}/models", headers=endpoints.auth("management"), timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()["models"]


def scale(endpoints, lane: str, workers: int) -> None:
    url = f"{endpoints.management}/models/{lane}?min_worker={workers}&max_worker={workers}&synchronous=true"
    reply = requests.put(url, headers=endpoints.auth("management"), timeout=180)
    assert reply.status_code == 200, reply.text
