"""schemathesis against a real TorchServe, from the description it serves at OPTIONS / (repaired): short runs
on the digits and minilm lanes here, a longer one in `make fuzz`. No 5xx, no worker restart, and every lane
answers its known input as before (scripts/hardening/fuzz.py)."""

from __future__ import annotations

import pytest
import requests
import schemathesis

from scripts.hardening import fuzz
from scripts.layout import JSON
from scripts.swap.management import ManagementApi

# Per server (digits, minilm): about 25 s of make test in all. The seed is fixed so a failure here replays;
# `make fuzz` draws a new one each run and prints it.
FUZZ_SECONDS = 12
FUZZ_SEED = 1017
MODELS = [("digits_server", "digits"), ("minilm_server", "minilm")]


def lanes(model: str) -> dict[str, str]:
    return {model: model, f"{model}-bulk": model}


@pytest.mark.parametrize("server, model", MODELS)
def test_torchserve_description_is_repaired_into_one_valid_operation_per_lane(server, model, request):
    raw = fuzz.fetch_description(request.getfixturevalue(server).server.torchserve_endpoints)
    # What TorchServe 0.12 gets wrong, as problems() names it; the repair fixes each.
    assert "operationId 'predictions' is used by 3 operations (it must be unique)" in fuzz.problems(raw)
    assert f"POST {fuzz.PREDICTIONS}: request body is any bytes of any type (*/*)" in fuzz.problems(raw)
    repaired = fuzz.repair(raw, lanes(model))
    assert fuzz.problems(repaired) == []
    schema = schemathesis.openapi.from_dict(repaired)
    operations = {op.ok().label: op.ok() for op in schema.get_all_operations()}
    assert sorted(operations) == [f"POST /predictions/{lane}" for lane in sorted(lanes(model))]
    raw_media = "image/png" if model == "digits" else "text/plain"
    for operation in operations.values():
        assert sorted(body.media_type for body in operation.body) == sorted([JSON, raw_media])
    # TorchServe's own answers are kept, the contract's 4xx added.
    answers = repaired["paths"][f"/predictions/{model}"]["post"]["responses"]
    assert {"404", "500", "503", "400", "413"} <= set(answers)


@pytest.mark.parametrize("server, model", MODELS)
def test_fuzzing_finds_no_server_error_and_leaves_every_lane_answering(server, model, request):
    running = request.getfixturevalue(server)
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


# Found by this fuzzer (schemathesis 4.32.5, first run): an error message that quotes what the client sent
# became the HTTP reason phrase, and TorchServe 0.12 frames that phrase by its length in characters but
# writes it as UTF-8 bytes; one non-ASCII character desynchronised the worker's socket, the frontend dropped
# the worker ("Worker died.", a 500 for the whole batch) and restarted it.
FINDINGS = [
    ("digits", b'{"instances": [{"b64": "", "\xc3\xa9": 1}]}'),
    ("digits", ('{"instances": [[' + ", ".join(['"é"'] * 64) + "]]}").encode()),
    ("minilm", '{"clé": ["a sentence"]}'.encode()),
]


@pytest.mark.parametrize("server, model", MODELS)
def test_bad_input_quoted_in_non_ascii_gets_a_400_and_no_worker_dies(server, model, request):
    endpoints = request.getfixturevalue(server).endpoints
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
    answer = fuzz.known_answer(endpoints, model, model)
    assert answer == fuzz.DIGIT_LABEL if model == "digits" else len(answer) == 384
