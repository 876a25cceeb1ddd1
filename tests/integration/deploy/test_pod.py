"""The pod's own parts against a real TorchServe (the session's server of each model; digits' for the gateway): the
probes' health check exactly as deployment.yaml runs it, the entry point's warm-up and samples gate, and the gateway
(nginx with deploy/k8s/gateway/) admitting the client token and forwarding with the server's key. Only paths and
ports differ from the pod: the key file's and TorchServe's, the gateway's."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from models import registry
from scripts.container import healthcheck
from scripts.container.warm import marker, warm
from scripts.deploy.manifests import K8S
from scripts.deploy.memory import GATEWAY_CONF, gateway_limits
from scripts.errors import ServerError
from scripts.layout import ROOT
from scripts.server.process import free_port, stop_process_group
from tests.integration.conftest import model_server
from tests.model_params import first_fast_others_slow

CLIENT_TOKEN = "client-token-for-the-gateway-test"
INSTALL_NGINX = "install nginx with its njs module: `apt-get install -y nginx libnginx-mod-http-js` (Debian/Ubuntu)"


def probe_command(served, key_file: Path, probe: str = "readinessProbe") -> list[str]:
    """The probe's command as deployment.yaml runs it, on this server's config and key file."""
    deployment = yaml.safe_load((K8S / "deployment.yaml").read_text())
    torchserve = deployment["spec"]["template"]["spec"]["containers"][0]
    command = list(torchserve[probe]["exec"]["command"])
    command[0] = sys.executable  # the image's python
    command[command.index("--config") + 1] = str(served.server.config)
    command[command.index("--key-file") + 1] = str(key_file)
    return command


def run_probe(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_readiness_waits_for_the_entry_points_warm_up_and_its_samples_gate(digits_server):
    """Start-up and readiness fail until every lane has been warmed and has answered its model's samples as
    samples.json says (the marker the entry point writes after both), liveness does not wait; the probes exactly as
    deployment.yaml runs them, the warm-up and the gate the entry point's, on the real lanes."""
    key_file = digits_server.endpoints.key_file
    marker(key_file).unlink(missing_ok=True)
    for probe in ("startupProbe", "readinessProbe"):
        waiting = run_probe(probe_command(digits_server, key_file, probe))
        assert waiting.returncode != 0 and "not warmed up yet" in waiting.stderr, waiting.stderr
    assert run_probe(probe_command(digits_server, key_file, "livenessProbe")).returncode == 0
    record = warmed_and_gated(digits_server, "digits")
    passed = run_probe(probe_command(digits_server, key_file))
    assert (passed.returncode, passed.stdout.strip()) == (0, "Healthy"), passed.stderr
    # A lane that answered them otherwise keeps readiness failing, named; liveness does not care.
    wrong = "gate FAILED on digits-bulk: 90.0% of 10 samples answered as expected (need 100%): sample 3: label 5 != 3"
    marker(key_file).write_text(json.dumps({**record, "failed_gates": [wrong]}))
    refused = run_probe(probe_command(digits_server, key_file))
    assert refused.returncode != 0 and wrong in refused.stderr and "samples.json" in refused.stderr, refused.stderr
    assert run_probe(probe_command(digits_server, key_file, "livenessProbe")).returncode == 0
    marker(key_file).write_text(json.dumps(record))


# digits is gated by the tests above in make test; these in make test-slow
@pytest.mark.parametrize("model", first_fast_others_slow(sorted(set(registry.models()) - {"digits"})))
def test_every_models_lanes_are_warmed_and_gated_on_its_own_samples_before_ready(request, model):
    """The same warm-up and gate on each other model's server (the readiness check in process: the probes' command
    is the test above's)."""
    served = model_server(request, model)
    key_file = served.endpoints.key_file
    marker(key_file).unlink(missing_ok=True)
    with pytest.raises(ServerError, match="not warmed up yet"):
        healthcheck.check(served.server.config, key_file, ready=True, warmed=True)
    record = warmed_and_gated(served, model)
    healthcheck.check(served.server.config, key_file, ready=True, warmed=True)
    marker(key_file).write_text(json.dumps({**record, "failed_gates": [f"gate FAILED on {model}-bulk: ..."]}))
    with pytest.raises(ServerError, match=f"otherwise than samples.json says .*gate FAILED on {model}-bulk"):
        healthcheck.check(served.server.config, key_file, ready=True, warmed=True)
    marker(key_file).write_text(json.dumps(record))


def warmed_and_gated(served, model: str) -> dict:
    """The entry point's warm-up on `served`'s lanes, checked: every lane warmed without a failed request and
    gated on every sample of its model (the same gate as hot-swap's) before the marker; the marker's record."""
    lanes = registry.model(model).lane_names
    warmed = warm(served.server.config, served.endpoints.key_file, seconds=0.5, burst_seconds=1.0 if shutil.which("wrk") else 0)
    assert {w.lane for w in warmed} == set(lanes) and all(w.requests > 0 and w.failed == 0 for w in warmed)
    record = json.loads(marker(served.endpoints.key_file).read_text())
    assert record["lanes"] == list(lanes)
    assert sum(w["requests"] for w in record["warm_ups"]) == sum(w.requests for w in warmed)
    samples = registry.model(model).samples()
    assert set(record["samples"]) == set(lanes) and record["failed_gates"] == []
    # digits' samples carry the data's true labels (min_agreement 0.95), and its training's floats differ by CPU: the
    # model trained on an AMD EPYC VM (2026-12-07) misses one of 200 (sample 113, 8 for a 5), earlier machines' none.
    # The other models' samples are their own answers (min_agreement 1.0).
    for lane, summary in record["samples"].items():
        passed = re.fullmatch(rf"gate passed on {lane}: ([\d.]+)% of {len(samples.instances)} samples answered .*", summary)
        assert passed and float(passed[1]) >= 100 * samples.min_agreement, summary
    return record


def test_the_probes_pass_with_the_servers_key_and_fail_without_it(digits_server, tmp_path):
    marker(digits_server.endpoints.key_file).write_text("{}")  # warmed (the test above warms for real)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        passed = run_probe(probe_command(digits_server, digits_server.endpoints.key_file, probe))
        assert (passed.returncode, passed.stdout.strip()) == (0, "Healthy"), passed.stderr
    keys = json.loads(digits_server.endpoints.key_file.read_text())
    keys["inference"]["key"] = "not-the-key"
    wrong = tmp_path / "key_file.json"
    wrong.write_text(json.dumps(keys))
    refused = run_probe(probe_command(digits_server, wrong))
    assert refused.returncode != 0 and "HTTP 400" in refused.stderr  # TorchServe's answer to a wrong, unexpired key
    missing = run_probe(probe_command(digits_server, tmp_path / "absent.json"))
    assert missing.returncode != 0 and "absent.json not found" in missing.stderr


def nginx_binary() -> Path:
    found = shutil.which("nginx") or next((p for p in (Path("/usr/sbin/nginx"),) if p.exists()), None)
    if found is None:
        pytest.fail(f"nginx not found: {INSTALL_NGINX}")
    return Path(found)


@pytest.fixture
def gateway(digits_server, tmp_path):
    """nginx with the gateway's files, forwarding to the digits server; yields its URL; always stopped."""
    nginx = nginx_binary()
    modules = nginx.resolve().parents[1] / "lib" / "nginx" / "modules"
    if not (modules / "ngx_http_js_module.so").exists():
        pytest.fail(f"nginx's njs module is not in {modules}: {INSTALL_NGINX}")
    port = free_port()
    conf = (K8S / "gateway" / "nginx.conf").read_text()
    conf = conf.replace("/usr/lib/nginx/modules/", f"{modules}/")
    upstream = digits_server.server.torchserve_endpoints.inference.split("//", 1)[1]
    conf = conf.replace("server 127.0.0.1:8080;", f"server {upstream};")
    conf = conf.replace("listen 8000 reuseport;", f"listen 127.0.0.1:{port};")
    (tmp_path / "nginx.conf").write_text(conf)
    shutil.copy(K8S / "gateway" / "gateway.js", tmp_path / "gateway.js")
    # As root (CI), nginx's workers would drop to `nobody`, which cannot read TorchServe's 0600 key file; in the
    # pod every container runs as the same user.
    directives = "daemon off;" + (" user root;" if os.geteuid() == 0 else "")
    env = {"CLIENT_TOKEN": CLIENT_TOKEN, "TORCHSERVE_KEY_FILE": str(digits_server.endpoints.key_file)}
    command = [str(nginx), "-p", f"{tmp_path}/", "-c", str(tmp_path / "nginx.conf"), "-e", "stderr", "-g", directives]
    with open(tmp_path / "nginx.out", "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url + "/healthz", process, tmp_path / "nginx.out")
        yield url
    finally:
        stop_process_group(process, timeout=10)


def wait_for(url: str, process: subprocess.Popen, log: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            pytest.fail(f"nginx exited with {process.returncode}: {log.read_text()}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"nginx did not answer {url} in {timeout:.0f}s: {log.read_text()}")
        time.sleep(0.1)


def test_the_gateway_admits_the_client_token_and_forwards_with_the_servers_key(gateway, digits_server):
    instances = {"instances": [[0] * 64, [16] * 64]}
    admitted = requests.post(f"{gateway}/predictions/digits", json=instances, headers={"Authorization": f"Bearer {CLIENT_TOKEN}"})
    assert admitted.status_code == 200, admitted.text
    predictions = admitted.json()["predictions"]
    assert len(predictions) == 2 and all(abs(sum(p["scores"]) - 1) < 1e-5 for p in predictions)
    # A worker's process id is told only to callers inside the pod that ask; the gateway drops the ask.
    asked = {"Authorization": f"Bearer {CLIENT_TOKEN}", "X-Report-Worker-Pid": "1"}
    outside = requests.post(f"{gateway}/predictions/digits", json=instances, headers=asked)
    assert outside.status_code == 200 and "X-Worker-Pid" not in outside.headers
    inside = requests.post(
        digits_server.endpoints.prediction_url("digits"),
        json=instances,
        headers={**digits_server.endpoints.auth("inference"), "X-Report-Worker-Pid": "1"},
    )
    assert int(inside.headers["X-Worker-Pid"]) > 1
    ping = requests.get(f"{gateway}/ping", headers={"Authorization": f"Bearer {CLIENT_TOKEN}"})
    assert (ping.status_code, ping.json()["status"]) == (200, "Healthy")
    # TorchServe's own key is no client token: it never works from outside the pod.
    server_key = digits_server.endpoints.auth("inference")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": CLIENT_TOKEN}, server_key):
        refused = requests.post(f"{gateway}/predictions/digits", json=instances, headers=headers)
        assert refused.status_code == 401, headers
        assert refused.json()["type"] == "Unauthorized"


def test_a_stream_body_over_its_lanes_byte_limit_is_refused_by_the_gateway_and_by_the_handler(gateway, digits_server):
    """The same number in both places: nginx cuts the stream route (413 before TorchServe reads the body); sent to
    TorchServe directly, the handler refuses it before parsing, with a 413 naming handler.max_request_bytes."""
    limit = 2097152  # models/digits/model-config.yaml handler.max_request_bytes' default
    body = b'{"instances": [' + b",".join([b"{}"] * ((limit - 14) // 3 + 2)) + b"]}"
    assert limit < len(body) < limit + 16
    client = {"Authorization": f"Bearer {CLIENT_TOKEN}", "Content-Type": "application/json"}
    cut = requests.post(f"{gateway}/predictions/digits", data=body, headers=client, timeout=60)
    assert cut.status_code == 413
    torchserve = digits_server.server.torchserve_endpoints
    direct = requests.post(
        torchserve.prediction_url("digits"),
        data=body,
        headers={**torchserve.auth("inference"), "Content-Type": "application/json"},
        timeout=60,
    )
    assert direct.status_code == 413
    assert direct.json()["message"] == (
        f"request body is {len(body)} bytes; lane digits takes at most {limit} bytes per request "
        "(handler.max_request_bytes): send it to lane digits-bulk (up to 67108864 bytes per request)"
    )
    # The bulk route takes it (and the handler refuses its {} rows as rows, not as bytes).
    bulk = requests.post(f"{gateway}/predictions/digits-bulk", data=body, headers=client, timeout=120)
    assert bulk.status_code == 413 and "rows" in bulk.json()["message"]


def test_a_bulk_route_takes_its_limit_of_requests_at_once_and_answers_503_past_it(gateway):
    """The gateway's limit_conn on digits-bulk (scripts/deploy/memory.py bulk_admitted, which sizes the frontend's
    heap): requests whose bodies are still arriving count; one more gets a 503 before its body is read; once they
    end, the route takes requests again."""
    limit = gateway_limits(GATEWAY_CONF.read_text())["digits-bulk"]
    host, port = gateway.removeprefix("http://").split(":")
    head = (
        f"POST /predictions/digits-bulk HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {CLIENT_TOKEN}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
    ).encode()
    client = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
    rows = {"instances": [[0] * 64]}
    held = [socket.create_connection((host, int(port)), timeout=30) for _ in range(limit)]
    try:
        for connection in held:
            connection.sendall(head)  # the body never comes: each request holds its place
        time.sleep(1.0)  # nginx has read every head by then
        refused = requests.post(f"{gateway}/predictions/digits-bulk", json=rows, headers=client, timeout=30)
        assert refused.status_code == 503
        # The stream route has no such limit.
        assert requests.post(f"{gateway}/predictions/digits", json=rows, headers=client, timeout=30).status_code == 200
    finally:
        for connection in held:
            connection.close()
    deadline = time.monotonic() + 10
    bulk = f"{gateway}/predictions/digits-bulk"
    while (answer := requests.post(bulk, json=rows, headers=client, timeout=30)).status_code == 503:
        assert time.monotonic() < deadline, "the bulk route still refuses after its held requests ended"
        time.sleep(0.2)
    assert answer.status_code == 200 and answer.json()["predictions"][0]["label"] in range(10)
