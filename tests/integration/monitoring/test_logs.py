"""The project's logging (monitoring/log4j2.xml and the worker's levels) on a real TorchServe: nothing per
successful request in any file, one line per failed request in the access log and in model_log.log."""

from __future__ import annotations

import re
import time
from pathlib import Path

import orjson
import requests

from models.digits.samples import held_out


def log_text(workdir: Path, name: str) -> str:
    path = workdir / "logs" / name
    return path.read_text() if path.exists() else ""


def sizes(workdir: Path) -> dict[str, int]:
    files = [*(workdir / "logs").glob("*.log"), workdir / "torchserve.out"]
    return {path.name: path.stat().st_size for path in files if path.exists()}


def post(server, body: bytes) -> requests.Response:
    endpoints = server.endpoints
    headers = {"Content-Type": "application/json", **endpoints.auth("inference")}
    return requests.post(endpoints.prediction_url("digits"), data=body, headers=headers, timeout=30)


def test_successful_requests_write_nothing_and_a_failed_one_writes_one_line_per_file(digits_server):
    grids, _ = held_out(40)
    post(digits_server, orjson.dumps({"instances": [grids[0].tolist()]}))  # the lane's first batch may log start-up
    time.sleep(1.0)
    before = sizes(digits_server.workdir)
    for grid in grids:
        assert post(digits_server, orjson.dumps({"instances": [grid.tolist()]})).status_code == 200
    time.sleep(1.0)  # the frontend writes the worker's lines from its reader thread
    assert sizes(digits_server.workdir) == before, "40 successful requests grew the logs"

    # The session's server has answered other tests' bad requests before: count only the lines this one adds.
    access_before = len(log_text(digits_server.workdir, "access_log.log").splitlines())
    model_before = len(log_text(digits_server.workdir, "model_log.log").splitlines())
    bad = post(digits_server, orjson.dumps({"instances": [[0] * 10]}))
    assert bad.status_code == 400
    time.sleep(1.0)
    new_access = log_text(digits_server.workdir, "access_log.log").splitlines()[access_before:]
    access = [line for line in new_access if "/predictions/digits" in line]
    assert len(access) == 1 and re.search(r'" 400 ', access[0]), access
    new_model = log_text(digits_server.workdir, "model_log.log").splitlines()[model_before:]
    failed = [line for line in new_model if "answered 400" in line]
    assert len(failed) == 1 and "expected 64 values" in failed[0], failed
    frontend = log_text(digits_server.workdir, "ts_log.log")
    assert "Backend response time" not in frontend and "Sending response for jobId" not in frontend
    assert "Backend received inference" not in log_text(digits_server.workdir, "model_log.log")
