"""schemathesis against a real TorchServe, from the description it serves at OPTIONS / (repaired): short runs
on every model's lanes here, a longer one in `make fuzz`. No 5xx, no worker restart, and every lane answers its
model's samples after the run (scripts/hardening/fuzz.py)."""

from __future__ import annotations

import pytest
import requests
import schemathesis

from models import registry
from scripts.hardening import fuzz
from scripts.layout import JSON
from scripts.server.samples_gate import gate
from scripts.swap.management import ManagementApi
from tests.integration.conftest import model_server

# Per model's server: about 10 s each of make test. The seed is fixed so a failure here replays; `make fuzz` draws
# a new one each run and prints it.
FUZZ_SECONDS = 10
FUZZ_SEED = 1017
MODELS = sorted(registry.models())


def lanes(model: str) -> dict[str, str]:
    return fuzz.lanes_of((model,))


def test_every_lane_of_every_model_is_fuzzed_with_its_tasks_request_bodies():
    assert fuzz.lanes_of() == {lane.name: lane.model for lane in registry.lanes()}
    assert set(fuzz.lanes_of().values()) == set(MODELS) and len(MODELS) >= 3
    assert lanes("minilm") == {"minilm": "minilm", "minilm-bulk": "minilm"}
    assert sorted(fuzz.request_bodies("efficientnet_lite0")) == [JSON, "image/jpeg", "image/png", "image/webp"]


@pytest.mark.parametrize("model", MODELS)
def test_torchserve_description_is_repaired_into_one_valid_operation_per_lane(model, request):
    raw = fuzz.fetch_description(model_server(request, model).server.torchserve_endpoints)
    # What TorchServe 0.12 gets wrong, as problems() names it; the repair fixes each.
    assert "operationId 'predictions' is used by 3 operations (it must be unique)" in fuzz.problems(raw)
    assert f"POST {fuzz.PREDICTIONS}: request body is any bytes of any type (*/*)" in fuzz.problems(raw)
    repaired = fuzz.repair(raw, lanes(model))
    assert fuzz.problems(repaired) == []
    schema = schemathesis.openapi.from_dict(repaired)
    operations = {op.ok().label: op.ok() for op in schema.get_all_operations()}
    assert sorted(operations) == [f"POST /predictions/{lane}" for lane in sorted(lanes(model))]
    for operation in operations.values():
        assert sorted(body.media_type for body in operation.body) == sorted(fuzz.request_bodies(model))
    # TorchServe's own answers are kept, the contract's 4xx added.
    answers = repaired["paths"][f"/predictions/{model}"]["post"]["responses"]
    assert {"404", "500", "503", "400", "413"} <= set(answers)


@pytest.mark.parametrize("model", MODELS)
def test_fuzzing_finds_no_server_error_and_leaves_every_lane_answering(model, request):
    running = model_server(request, model)
    report = fuzz.check(
        running.endpoints,
        max_examples=50,
        max_time=FUZZ_SECONDS,
        lanes=lanes(model),
        seed=FUZZ_SEED,
        described_by=running.server.torchserve_endpoints,
    )
    print(report.text())
    assert report.failures == [], report.text()
    run = report.run
    assert set(run.by_lane) == set(lanes(model)) and run.requests >= 20
    # Both kinds of request went out: valid ones answered, invalid ones refused with a 4xx.
    assert run.statuses[200] > 0 and sum(n for status, n in run.statuses.items() if 400 <= status < 500) > 0
    assert report.before.worker_pids == report.after.worker_pids
    assert all(pids for pids in report.after.worker_pids.values())
    assert all(answer.passed and answer.rows > 0 for answer in report.after.answers.values())


# Found by this fuzzer (schemathesis 4.32.5, first run): an error message that quotes what the client sent
# became the HTTP reason phrase, and TorchServe 0.12 frames that phrase by its length in characters but
# writes it as UTF-8 bytes; one non-ASCII character desynchronised the worker's socket, the frontend dropped
# the worker ("Worker died.", a 500 for the whole batch) and restarted it.
FINDINGS = [
    ("digits", b'{"instances": [{"b64": "", "\xc3\xa9": 1}]}'),
    ("digits", ('{"instances": [[' + ", ".join(['"é"'] * 64) + "]]}").encode()),
    ("minilm", '{"clé": ["a sentence"]}'.encode()),
]


@pytest.mark.parametrize("model", ["digits", "minilm"])
def test_bad_input_quoted_in_non_ascii_gets_a_400_and_no_worker_dies(model, request):
    endpoints = model_server(request, model).endpoints
    management = ManagementApi(endpoints)
    before = {lane: management.versions(lane)[0].worker_pids for lane in lanes(model)}
    for lane, body in FINDINGS:
        if lane != model:
            continue
        reply = requests.post(
            endpoints.prediction_url(lane), data=body, headers={**endpoints.auth("inference"), "Content-Type": JSON}
        )
        assert reply.status_code == 400, (body, reply.status_code, reply.text)
        assert reply.json()["type"] and reply.json()["message"]
    assert {lane: management.versions(lane)[0].worker_pids for lane in lanes(model)} == before
    answered = gate(endpoints, model)
    assert answered.passed and answered.rows == len(registry.model(model).samples().instances), answered.summary()
