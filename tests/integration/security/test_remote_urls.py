"""Archives are registered from the model store only: TorchServe refuses every URL (allowed_urls matches none)."""

from __future__ import annotations

import grpc
import pytest
import requests

from scripts.archive.reader import MarFile
from scripts.clients.grpc_client import bearer
from scripts.clients.grpc_stubs import management_pb2, management_pb2_grpc


def register(endpoints, url: str) -> requests.Response:
    """A raw register call (ManagementApi.register takes only archives in the store, with their digest)."""
    params = {"url": url, "model_name": "intruder", "initial_workers": 1, "synchronous": "true"}
    return requests.post(f"{endpoints.management}/models", params=params, headers=endpoints.auth("management"), timeout=60)


def registered(endpoints) -> set[str]:
    reply = requests.get(f"{endpoints.management}/models", headers=endpoints.auth("management"), timeout=30)
    return {model["modelName"] for model in reply.json()["models"]}


@pytest.fixture
def outside_archive(digits_server, tmp_path):
    """A good, recorded archive outside the model store: a file:// URL must not bring it in either."""
    return MarFile(digits_server.model_store / "digits.mar").copy(tmp_path / "elsewhere.mar").path


def test_rest_register_refuses_remote_and_file_urls(digits_server, outside_archive):
    e = digits_server.endpoints
    before = registered(e)
    urls = ["http://example.com/digits.mar", "https://127.0.0.1:9/digits.mar", f"file://{outside_archive}"]
    for url in urls:
        reply = register(e, url)
        assert reply.status_code == 404, reply.text
        assert reply.json() == {
            "code": 404,
            "type": "ModelNotFoundException",
            "message": f"Given URL {url} does not match any allowed URL(s)",
        }
    assert registered(e) == before
    assert not (digits_server.model_store / "elsewhere.mar").exists()


def test_grpc_register_refuses_a_remote_url(digits_server):
    e = digits_server.endpoints
    url = "https://example.com/digits.mar"
    with grpc.insecure_channel(f"{e.grpc_host}:{e.grpc_management_port}") as channel:
        stub = management_pb2_grpc.ManagementAPIsServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.RegisterModel(
                management_pb2.RegisterModelRequest(url=url, model_name="intruder"),
                metadata=bearer(e.token("management")),
                timeout=60,
            )
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert refused.value.details().startswith(f"Given URL {url} does not match any allowed URL(s)")
    assert "intruder" not in registered(e)
