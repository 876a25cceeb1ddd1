"""Token authorization on the session's TorchServe: every API refuses a missing, wrong or other-kind key,
and every client here recovers from a key rotated while its request was on the way.

The rotation is made deterministic by RotatedInFlight: it hands out the current key, then has
TorchServe rotate it (management API /token) before the request leaves, so the request arrives with a
key the server no longer accepts, exactly as after an expiry or a rotation by someone else.
"""

from __future__ import annotations

import dataclasses
import json

import grpc
import pytest
import requests

from models.digits.samples import digit_rows, grid_png, held_out
from scripts.clients.grpc_client import GrpcClient, bearer
from scripts.clients.grpc_stubs import inference_pb2, inference_pb2_grpc, management_pb2, management_pb2_grpc
from scripts.clients.rest import predict
from scripts.jobs.chunks import RetryPolicy, run_chunk
from scripts.jobs.inputs import Row
from scripts.jobs.runners import ServerRunner
from scripts.layout import JSON
from scripts.server.endpoints import Endpoints, read_key
from scripts.server.endpoints import main as endpoints_command
from scripts.server.samples_gate import gate
from scripts.swap.hot_swap import Swapper
from scripts.swap.management import ManagementApi

# TorchServe 0.12's answers (REST: HTTP 400, gRPC: PERMISSION_DENIED), for a missing, wrong or expired key.
REFUSAL = "Token Authorization failed. Token either incorrect, expired, or not provided correctly"
TOKEN_API_REFUSAL = "Token Authentication failed. Token either incorrect, expired, or not provided correctly"


@dataclasses.dataclass(frozen=True)
class RotatedInFlight(Endpoints):
    """Endpoints whose every `every`-th key is rotated at the server right after it was handed out."""

    every: int = 1
    handed: list = dataclasses.field(default_factory=list)
    rotated: list = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, endpoints: Endpoints, every: int = 1) -> RotatedInFlight:
        return cls(**{f.name: getattr(endpoints, f.name) for f in dataclasses.fields(Endpoints)}, every=every)

    def token(self, kind: str) -> str:
        key = super().token(kind)
        self.handed.append(key)
        if len(self.handed) % self.every == 0:
            self.rotate(kind)
            self.rotated.append(key)
        return key


def keys(endpoints: Endpoints) -> dict[str, str]:
    return {kind: read_key(endpoints.key_file, kind).value for kind in ("inference", "management", "API")}


def headers_for(case: str, key_file_keys: dict[str, str], own: str) -> dict[str, str]:
    other = "management" if own == "inference" else "inference"
    return {"missing": {}, "wrong": {"Authorization": "Bearer nope"}, "other kind": bearer_header(key_file_keys[other])}[case]


def bearer_header(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


CASES = ["missing", "wrong", "other kind"]


@pytest.mark.parametrize("case", CASES)
def test_rest_inference_and_management_refuse_a_bad_token(digits_server, case):
    e = digits_server.endpoints
    current = keys(e)
    image = grid_png(held_out(1)[0][0])
    inference = requests.post(
        e.prediction_url("digits"),
        data=image,
        headers={"Content-Type": "image/png", **headers_for(case, current, "inference")},
        timeout=30,
    )
    management = requests.get(f"{e.management}/models", headers=headers_for(case, current, "management"), timeout=30)
    for reply in (inference, management):
        assert reply.status_code == 400
        assert reply.json() == {"code": 400, "type": "InvalidKeyException", "message": REFUSAL}
    assert requests.get(f"{e.management}/models", headers=bearer_header(current["management"]), timeout=30).status_code == 200


@pytest.fixture(scope="module")
def grpc_calls(digits_server):
    """One raw call per gRPC API, taking the metadata to send: what TorchServe answers is what is tested."""
    e = digits_server.endpoints
    with (
        grpc.insecure_channel(f"{e.grpc_host}:{e.grpc_inference_port}") as inference,
        grpc.insecure_channel(f"{e.grpc_host}:{e.grpc_management_port}") as management,
    ):
        predictions = inference_pb2_grpc.InferenceAPIsServiceStub(inference).Predictions
        list_models = management_pb2_grpc.ManagementAPIsServiceStub(management).ListModels
        request = inference_pb2.PredictionsRequest(model_name="digits", input={"body": b"{}"})
        yield {
            "inference": lambda metadata: predictions(request, metadata=metadata, timeout=30),
            "management": lambda metadata: list_models(management_pb2.ListModelsRequest(limit=10), metadata=metadata, timeout=30),
        }


@pytest.mark.parametrize("case", CASES)
def test_grpc_inference_and_management_refuse_a_bad_token(digits_server, grpc_calls, case):
    current = keys(digits_server.endpoints)
    for kind, call in grpc_calls.items():
        header = headers_for(case, current, kind)
        metadata = bearer(header["Authorization"].removeprefix("Bearer ")) if header else None
        with pytest.raises(grpc.RpcError) as refused:
            call(metadata)
        assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.PERMISSION_DENIED, REFUSAL)
    assert "digits" in grpc_calls["management"](bearer(current["management"])).msg


def test_only_the_api_key_rotates_keys(digits_server, capsys):
    e = digits_server.endpoints
    before = keys(e)
    reply = requests.get(
        f"{e.management}/token", params={"type": "inference"}, headers=bearer_header(before["management"]), timeout=30
    )
    assert reply.status_code == 400 and reply.json()["message"] == TOKEN_API_REFUSAL
    assert keys(e) == before
    server_options = ["--config", str(digits_server.server.config), "--key-file", str(e.key_file)]
    assert endpoints_command(["rotate", "inference", *server_options]) == 0
    assert capsys.readouterr().out.startswith(f"new inference key in {e.key_file} (valid until ")
    after = keys(e)
    assert after["inference"] != before["inference"]
    assert after["management"] == before["management"] and after["API"] == before["API"]
    old = requests.post(
        e.prediction_url("digits"), data=b"{}", headers={"Content-Type": JSON, **bearer_header(before["inference"])}, timeout=30
    )
    assert old.status_code == 400 and old.json()["message"] == REFUSAL


def test_rest_and_grpc_clients_resend_with_the_rotated_key(digits_server):
    grids, labels = held_out(6)
    rotating = RotatedInFlight.of(digits_server.endpoints)
    reply = predict(rotating, "digits", grid_png(grids[0]), "image/png")
    assert reply.status_code == 200 and reply.json()["label"] == labels[0]
    assert len(rotating.rotated) == 1

    every_third = RotatedInFlight.of(digits_server.endpoints, every=3)
    with GrpcClient(every_third) as client:
        assert client.predict("digits", grid_png(grids[0]))["label"] == labels[0]
        # A stream's calls are in flight together: the refused ones are sent again when their turn comes.
        streamed = list(client.stream("digits", [grid_png(grid) for grid in grids], window=3))
    assert [result["label"] for result in streamed] == labels.tolist()
    assert len(every_third.rotated) >= 2


def test_a_batch_jobs_chunks_and_the_hot_swaps_calls_survive_rotations(digits_server):
    rotating = RotatedInFlight.of(digits_server.endpoints, every=2)
    rows = digit_rows(300)
    runner = ServerRunner(rotating, "digits-bulk", size_limit=1 << 20)
    results = []
    for start in range(0, 300, 50):
        chunk = [Row(i, f"digit-{i}", rows.instances[i]) for i in range(start, start + 50)]
        results += run_chunk(runner.send, chunk, RetryPolicy(attempts=1))
    assert [r.error for r in results] == [None] * 300
    assert sum(r.prediction["label"] == label for r, label in zip(results, rows.labels, strict=True)) >= 0.97 * 300
    assert len(rotating.rotated) == 3

    management = RotatedInFlight.of(digits_server.endpoints)
    swapper = Swapper(management, digits_server.server.config, digits_server.model_store, log=lambda line: None)
    assert swapper.current_default("digits").version == "1.0"  # two management calls, each key rotated in flight
    assert gate(management, "digits", "1.0").passed
    assert len(management.rotated) >= 3
    assert ManagementApi(digits_server.endpoints).version("digits", "1.0").ready_workers >= 1
    print(f"\nrotated in flight: {len(rotating.rotated)} inference keys (batch job), {len(management.rotated)} (hot-swap calls)")


def test_the_key_file_is_for_its_owner_only(digits_server):
    assert digits_server.endpoints.key_file.stat().st_mode & 0o777 == 0o600
    assert set(json.loads(digits_server.endpoints.key_file.read_text())) == {"inference", "management", "API"}
