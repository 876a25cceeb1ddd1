"""The front door (nginx, scripts/server/front_door.py) before a real TorchServe: what a client can send through
it never stops or stalls the server. Forms, malformed framing and half-open connections are the attacks that
took TorchServe 0.12's frontend (netty 4.1.53) down or stalled it when it faced clients itself."""

from __future__ import annotations

import io
import json
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import psutil
import pytest
import requests

from scripts.clients.grpc_client import GrpcClient
from scripts.server.front_door import HEADER_TIMEOUT_S

PNG = Path(__file__).resolve().parents[2] / "fixtures" / "digit_7.png"
MIB = 1024 * 1024
ONE_ROW = {"instances": [[0] * 64]}


def frontend_rss(running) -> int:
    launcher = psutil.Process(running.server.process.pid)
    java = next(p for p in [launcher, *launcher.children(recursive=True)] if p.name() == "java")
    return java.memory_info().rss


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def raw(url: str, data: bytes, timeout: float = 5.0) -> bytes:
    """`data` sent as is on a new connection; what came back until the server closed it or `timeout`."""
    with socket.create_connection(address(url), timeout=timeout) as sock:
        sock.sendall(data)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer and _complete(answer):
                    break
        except (TimeoutError, ConnectionResetError):
            pass
    return answer


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def body_of(answer: bytes) -> dict:
    return json.loads(answer.partition(b"\r\n\r\n")[2])


def predict_png(e, lane: str = "digits") -> requests.Response:
    return requests.post(
        e.prediction_url(lane), data=PNG.read_bytes(), headers={**e.auth("inference"), "Content-Type": "image/png"}, timeout=10
    )


def test_a_32_mib_form_body_is_refused_at_once_and_the_frontend_never_sees_it(digits_server):
    e = digits_server.endpoints
    before = frontend_rss(digits_server)
    form = b"a=&" * (32 * MIB // 3)
    started = time.monotonic()
    refused = requests.post(
        e.prediction_url("digits-bulk"),
        data=form,
        headers={**e.auth("inference"), "Content-Type": "application/x-www-form-urlencoded"},
        timeout=30,
    )
    took = time.monotonic() - started
    assert refused.status_code == 415, refused.text
    assert refused.json()["type"] == "UnsupportedMediaType" and "application/x-npy" in refused.json()["message"]
    assert "lane digits-bulk" in refused.json()["message"]
    assert took < 1.0, f"{took:.2f}s"
    multipart = requests.post(
        e.prediction_url("digits"), files={"data": ("digit.png", PNG.read_bytes(), "image/png")}, headers=e.auth("inference")
    )
    assert multipart.status_code == 415 and multipart.json()["type"] == "UnsupportedMediaType"
    assert predict_png(e).json()["label"] == 7
    assert frontend_rss(digits_server) - before < 32 * MIB


def test_sixteen_concurrent_2_mib_form_bodies_are_each_refused_within_a_second(digits_server):
    e = digits_server.endpoints
    before = frontend_rss(digits_server)
    form = b"a=&" * (2 * MIB // 3)
    headers = {**e.auth("inference"), "Content-Type": "application/x-www-form-urlencoded"}

    def send(_: int) -> tuple[int, float]:
        started = time.monotonic()
        reply = requests.post(e.prediction_url("digits"), data=form, headers=headers, timeout=30)
        return reply.status_code, time.monotonic() - started

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(send, range(16)))
    assert [status for status, _ in answers] == [415] * 16
    assert max(took for _, took in answers) < 1.0, answers
    assert frontend_rss(digits_server) - before < 32 * MIB


HEAD = b"POST /predictions/digits HTTP/1.1\r\nHost: front-door\r\nAuthorization: Bearer {token}\r\n"
ATTEMPTS = {
    "content-length-and-transfer-encoding": b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "two-content-lengths": b"Content-Length: 2\r\nContent-Length: 40\r\nContent-Type: application/json\r\n\r\n{}",
    "control-character-in-a-header-name": b"X-Smug\x01gled: 1\r\nContent-Length: 2\r\n\r\n{}",
    "obfuscated-transfer-encoding": b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
    "invalid-chunk-size": b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n2x\r\n{}\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_a_smuggling_attempt_is_refused_by_the_front_door(digits_server, attempt):
    e = digits_server.endpoints
    head = HEAD.replace(b"{token}", e.token("inference").encode())
    answer = raw(e.inference, head + ATTEMPTS[attempt])
    assert status_of(answer) == 400, answer[:300]
    assert body_of(answer)["type"] == "BadRequest", answer[:300]
    assert predict_png(e).json()["label"] == 7  # nothing was left on a connection to TorchServe


def test_a_chunked_body_with_extensions_reaches_the_lane_re_encoded(digits_server):
    """Chunk extensions (well-formed, or ended by a bare LF as in netty's CVE-2025-58056) end at the front door:
    TorchServe gets the body it parsed, framed by Content-Length, and answers exactly that body."""
    e = digits_server.endpoints
    body = json.dumps(ONE_ROW).encode()
    chunked = b"".join(f"{len(part):x};ext=1\r\n".encode() + part + b"\r\n" for part in (body[:10], body[10:])) + b"0\r\n\r\n"
    head = (
        HEAD.replace(b"{token}", e.token("inference").encode())
        + b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
    )
    answer = raw(e.inference, head + chunked)
    assert status_of(answer) == 200, answer[:300]
    assert body_of(answer)["predictions"][0]["label"] in range(10)
    bare_lf = raw(e.inference, head + b"2;a=b\n{}\r\n0\r\n\r\n")
    assert status_of(bare_lf) == 400 and "got keys []" in body_of(bare_lf)["message"]  # the handler read `{}`, no more


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/json", json.dumps(ONE_ROW).encode()),
        ("application/json; charset=utf-8", json.dumps(ONE_ROW).encode()),
        ("image/png", PNG.read_bytes()),
        ("application/octet-stream", PNG.read_bytes()),
        (None, PNG.read_bytes()),
        ("application/x-npy", None),
    ],
)
def test_the_payload_contracts_content_types_reach_the_lane(digits_server, content_type, body):
    e = digits_server.endpoints
    if body is None:
        buffer = io.BytesIO()
        np.save(buffer, np.zeros((2, 64), dtype=np.uint8), allow_pickle=False)
        body = buffer.getvalue()
    headers = {**e.auth("inference"), **({"Content-Type": content_type} if content_type else {})}
    reply = requests.post(e.prediction_url("digits"), data=body, headers=headers, timeout=10)
    assert reply.status_code == 200, reply.text
    result = reply.json()
    assert (result["predictions"][0] if "predictions" in result else result)["label"] in range(10)


@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml", "text/html"]
)
def test_other_content_types_are_refused_naming_the_accepted_ones(digits_server, content_type):
    e = digits_server.endpoints
    reply = requests.post(
        e.prediction_url("digits"), data=b"a=1", headers={**e.auth("inference"), "Content-Type": content_type}, timeout=10
    )
    assert reply.status_code == 415
    accepted = "application/json, application/*+json, application/x-npy, image/*, application/octet-stream"
    assert f"not accepted by lane digits: send one of {accepted}" in reply.json()["message"]


def test_routes_sizes_and_heads_are_bounded_with_an_answer_naming_the_limit(digits_server):
    e = digits_server.endpoints
    auth = e.auth("inference")
    too_large = requests.post(
        e.prediction_url("digits"), data=b"\0" * (3 * MIB), headers={**auth, "Content-Type": "image/png"}, timeout=10
    )
    assert too_large.status_code == 413 and "2097152 bytes, the limit of lane digits" in too_large.json()["message"]
    unknown = requests.post(e.prediction_url("digitz"), json=ONE_ROW, headers=auth, timeout=10)
    assert unknown.status_code == 404 and "lanes digits, digits-bulk" in unknown.json()["message"]
    other_api = requests.get(f"{e.inference}/v2/models", headers=auth, timeout=10)
    assert other_api.status_code == 404
    long_url = requests.post(e.prediction_url("digits") + "?" + "x" * 20000, json=ONE_ROW, headers=auth, timeout=10)
    assert long_url.status_code == 414
    long_header = requests.post(e.prediction_url("digits"), json=ONE_ROW, headers={**auth, "X-Big": "x" * 20000}, timeout=10)
    assert long_header.status_code == 400 and long_header.json()["type"] == "RequestHeaderTooLarge"
    ping = requests.get(f"{e.inference}/ping", headers=auth, timeout=10)
    assert (ping.status_code, ping.json()["status"]) == (200, "Healthy")


def test_management_metrics_and_grpc_are_behind_the_front_door_with_their_own_rules(digits_server):
    e = digits_server.endpoints
    direct = digits_server.server.torchserve_endpoints
    assert e.inference != direct.inference and e.grpc_inference_port != direct.grpc_inference_port
    models = requests.get(f"{e.management}/models", headers=e.auth("management"), timeout=10)
    assert {m["modelName"] for m in models.json()["models"]} == {"digits", "digits-bulk"}
    form = requests.post(
        f"{e.management}/models",
        data={"url": "digits.mar"},
        headers=e.auth("management"),
        timeout=10,
    )
    assert form.status_code == 415
    metrics = requests.get(f"{e.metrics}/metrics", timeout=10)
    assert metrics.status_code == 200 and "ts_inference_requests_total" in metrics.text
    assert requests.post(f"{e.metrics}/metrics", timeout=10).status_code == 403
    assert requests.get(f"{e.metrics}/other", timeout=10).status_code == 404
    with GrpcClient(e, timeout=30) as client:
        assert client.predict("digits", PNG.read_bytes())["label"] == 7


HOLDER = textwrap.dedent(
    """
    import socket, sys
    source, host, port, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    held = []
    for _ in range(count):
        sock = socket.socket()
        sock.bind((source, 0))
        sock.connect((host, port))
        sock.sendall(b"POST /predictions/digits HTTP/1.1\\r\\nHost: front-door\\r\\nContent-Le")
        held.append(sock)
    print(len(held), flush=True)
    sys.stdin.readline()
    closed = 0
    for sock in held:
        sock.setblocking(False)
        try:
            closed += sock.recv(1) == b""
        except BlockingIOError:
            pass
        except ConnectionError:
            closed += 1
    print(closed, flush=True)
    """
)


def test_tens_of_thousands_of_half_open_connections_leave_a_real_client_served(digits_server):
    """Two processes (each within its descriptor limit, from its own loopback address: one address has 28k ports)
    hold 30,000 connections that sent half a request head; a real client is served within a second, and the
    front door drops the half-open ones after its header timeout."""
    e = digits_server.endpoints
    host, port = address(e.inference)
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER, source, host, str(port), "15000"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for source in ("127.0.0.2", "127.0.0.3")
    ]
    try:
        assert [int(h.stdout.readline()) for h in holders] == [15000, 15000]
        held_at = time.monotonic()
        started = time.monotonic()
        served = predict_png(e)
        took = time.monotonic() - started
        assert served.status_code == 200 and served.json()["label"] == 7
        assert took < 1.0, f"{took:.2f}s"
        ping = requests.get(f"{e.inference}/ping", headers=e.auth("inference"), timeout=5)
        assert ping.status_code == 200
        time.sleep(max(0.0, held_at + HEADER_TIMEOUT_S + 3 - time.monotonic()))
        for h in holders:
            h.stdin.write("check\n")
            h.stdin.flush()
        assert [int(h.stdout.readline()) for h in holders] == [15000, 15000]  # every one dropped by the front door
    finally:
        for h in holders:
            h.kill()
            h.wait()


FLOOD = (
    'wrk.method = "POST"\nwrk.body = string.rep("a=&", 699050)\n'
    'wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"\n'
)


def latencies(e, count: int) -> list[float]:
    out = []
    with requests.Session() as session:
        headers = {**e.auth("inference"), "Content-Type": "image/png"}
        body = PNG.read_bytes()
        for _ in range(count):
            started = time.monotonic()
            reply = session.post(e.prediction_url("digits"), data=body, headers=headers, timeout=10)
            out.append(time.monotonic() - started)
            assert reply.status_code == 200, reply.text
    return out


def test_stream_traffic_beside_a_form_flood_keeps_its_latency(digits_server, tmp_path):
    """wrk floods the stream lane with 2 MiB form bodies on 16 connections while one client sends PNGs: every
    PNG is answered 200, within a second, its median within milliseconds of its median alone."""
    wrk = shutil.which("wrk")
    if wrk is None:
        pytest.fail("wrk not found: apt-get install wrk (system-packages.sh test)")
    e = digits_server.endpoints
    alone = latencies(e, 200)
    script = tmp_path / "flood.lua"
    script.write_text(FLOOD + f'wrk.headers["Authorization"] = "Bearer {e.token("inference")}"\n')
    flood = subprocess.Popen(
        [wrk, "-t1", "-c16", "-d30s", "-s", str(script), e.prediction_url("digits")], stdout=subprocess.PIPE, text=True
    )
    try:
        time.sleep(1.0)
        beside = latencies(e, 200)
    finally:
        flood.send_signal(signal.SIGINT)
        report = flood.communicate(timeout=30)[0]
    p50_alone, p50_beside = statistics.median(alone), statistics.median(beside)
    print(f"stream p50 alone {p50_alone * 1000:.2f} ms, beside the flood {p50_beside * 1000:.2f} ms; wrk: {report}")
    assert "Non-2xx or 3xx responses" in report  # the flood ran, and was refused
    # The flood costs CPU (wrk, and nginx reading and dropping 2 MiB bodies) on the same machine; it never reaches
    # TorchServe, so the stream lane keeps answering within milliseconds of its time alone.
    assert p50_beside < p50_alone + 0.025 and max(beside) < 1.0, (p50_alone, p50_beside, max(beside))
