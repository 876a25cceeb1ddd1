"""Faults under load, against a TorchServe of these tests' own (conftest.py): clients that disconnect
mid-request, a full queue, workers SIGKILLed mid-batch, a forward that hangs past responseTimeout, the
frontend restarted under a batch job.

In each case the lanes answer correctly afterwards, every request gets a 200 or a clear 5xx within its
client timeout (none hangs), and a batch job running through the fault ends with exactly one result per
row, in order. Each test prints what it saw (codes, counts, recovery times) on a `[faults]` line (pytest -s).
The tests share one server and run in file order: the restart comes last.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import numpy as np
import pytest

from models.digits.samples import digit_rows, write_jsonl
from scripts.clients.load import Answer, send_concurrently
from scripts.clients.rest import NO_WORKER, predict
from scripts.clients.rest import main as rest_main
from scripts.jobs.batch_job import EXIT_OK, JobConfig, JobSummary, run_job
from scripts.jobs.batch_job import main as batch_job_main
from scripts.jobs.chunks import RetryPolicy
from scripts.jobs.outputs import read_results
from scripts.jobs.runners import JobError
from scripts.layout import ROOT
from scripts.swap.management import ManagementApi
from tests.batch_jobs import digits_job, on_server
from tests.integration.faults.conftest import JOB_QUEUE_SIZE, LANES, RESPONSE_TIMEOUT, STREAM_TIMEOUT, FaultServer

PNG_FILE = ROOT / "tests" / "fixtures" / "digit_7.png"
PNG = PNG_FILE.read_bytes()
IMAGE = "image/png"
REQUEST_TIMEOUT = 60  # seconds: a request without an answer by then counts as hung
JOB_TIMEOUT = 300  # seconds: a batch job not done by then counts as hung
ROWS = digit_rows(300)
WORKER_DIED = "Worker died."


def report(case: str, **outcomes) -> None:
    print(f"[faults] {case}: " + ", ".join(f"{key}={value}" for key, value in outcomes.items()))


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 180) -> float:
    """Seconds until `condition()` held; fails the test after `timeout`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not after {timeout:.0f}s")
        time.sleep(0.1)
    return time.monotonic() - started


def quiet_for(seconds: float, condition: Callable[[], bool]) -> Callable[[], bool]:
    """`condition` held on every poll for `seconds` in a row: a queue read just after requests were sent can be
    empty because the frontend has not read them off their sockets yet (they queue a few ms later)."""
    since: list[float] = []

    def held() -> bool:
        if not condition():
            since.clear()
            return False
        since[:] = since or [time.monotonic()]
        return time.monotonic() - since[0] >= seconds

    return held


def lane_state(fault_server: FaultServer, lane: str):
    return ManagementApi(fault_server.endpoints).versions(lane)[0]


def worker_pids(fault_server: FaultServer) -> dict[str, tuple[int, ...]]:
    return {lane: ManagementApi(fault_server.endpoints).worker_pids(lane) for lane in LANES}


def answers_correctly(fault_server: FaultServer, lane: str) -> None:
    reply = predict(fault_server.endpoints, lane, PNG, IMAGE, timeout=REQUEST_TIMEOUT)
    assert reply.status_code == 200, reply.text
    assert reply.json()["label"] == 7


def tally(answers: list[Answer]) -> Counter:
    """Status codes of stream answers; each one is a correct 200 or a 5xx that says what happened."""
    for answer in answers:
        if answer.reply.status_code == 200:
            assert answer.reply.json()["label"] == 7
        else:
            assert answer.reply.status_code >= 500 and answer.reply.json()["message"], answer.reply.text
    return Counter(answer.reply.status_code for answer in answers)


CLIENTS = 6


def stream_load(fault_server: FaultServer, requests: int, clients: int = CLIENTS) -> list[Answer]:
    return send_concurrently(fault_server.endpoints, "digits", [PNG] * requests, [IMAGE] * requests, clients, REQUEST_TIMEOUT)


def job_config(fault_server: FaultServer, tmp_path, notify: Callable[[str], None], **retry) -> JobConfig:
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    options = {"chunk_size": 25, "concurrency": 2, "retry": RetryPolicy(notify=notify, **retry), **on_server(fault_server)}
    return digits_job(source, tmp_path / "out.jsonl", **options)


def check_job(summary: JobSummary, tmp_path) -> None:
    assert (summary.predicted, summary.failed) == (len(ROWS.labels), 0)
    check_results(tmp_path)


def check_results(tmp_path) -> int:
    """Exactly one result per row, in input order, and the right labels."""
    results = read_results(tmp_path / "out.jsonl")
    assert [r["id"] for r in results] == [f"digit-{n}" for n in range(len(ROWS.labels))]
    assert np.mean([r["prediction"]["label"] for r in results] == np.array(ROWS.labels)) >= 0.97
    return len(results)


def open_request(fault_server: FaultServer, lane: str, sent: int | None = None) -> socket.socket:
    """A POST of the digit image on a raw socket: all of it, or its headers and the first `sent` body bytes."""
    url = urlsplit(fault_server.endpoints.prediction_url(lane))
    head = (
        f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Authorization: Bearer {fault_server.endpoints.token('inference')}\r\n"
        f"Content-Type: {IMAGE}\r\nContent-Length: {len(PNG)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    sock.sendall(head + PNG[: len(PNG) if sent is None else sent])
    return sock


def test_clients_that_disconnect_mid_request_change_nothing_for_the_others(fault_server):
    before = worker_pids(fault_server)
    # A whole request, the client gone before the answer: the worker answers into a closed connection.
    with fault_server.stalled("digits") as stall:
        sock = open_request(fault_server, "digits")
        stall.pid()  # the request is in a worker's batch now
        sock.close()
        stall.release()
    # Headers and half the body, then gone, 20 times while other clients are being served: such a request
    # never reaches the queue.
    with ThreadPoolExecutor(1) as pool:
        load = pool.submit(stream_load, fault_server, 120, 4)
        for _ in range(20):
            open_request(fault_server, "digits", sent=len(PNG) // 2).close()
        codes = tally(load.result())
    assert codes == {200: 120}
    # 20 whole requests, each abandoned at once: TorchServe queues and runs them all the same (a burst of
    # them can fill the queue: docs/hardening.md), then drops the answers.
    for _ in range(20):
        open_request(fault_server, "digits").close()
    drained = wait_until(
        quiet_for(1.0, lambda: lane_state(fault_server, "digits").pending_requests == 0), "abandoned requests drained"
    )
    assert tally(stream_load(fault_server, 60)) == {200: 60}
    answers_correctly(fault_server, "digits")
    assert worker_pids(fault_server) == before  # no worker restarted
    report(
        "client disconnects", half_bodies=20, abandoned=21, served=180, abandoned_drained_s=round(drained, 1), workers_restarted=0
    )


def test_a_full_queue_gets_a_503_that_says_so_and_a_batch_job_waits_until_it_drains(fault_server, tmp_path, capsys):
    endpoints = fault_server.endpoints
    told: list[str] = []
    with fault_server.stalled("digits-bulk") as stall, ThreadPoolExecutor(JOB_QUEUE_SIZE + 2) as pool:
        send = (predict, endpoints, "digits-bulk", PNG, IMAGE)
        held = pool.submit(*send, timeout=REQUEST_TIMEOUT)
        stall.pid()  # the lane's only worker holds that request: what comes next queues
        queued = [pool.submit(*send, timeout=REQUEST_TIMEOUT) for _ in range(JOB_QUEUE_SIZE)]
        wait_until(lambda: lane_state(fault_server, "digits-bulk").pending_requests == JOB_QUEUE_SIZE, "queue filled")

        # What TorchServe itself says (docs/hardening.md), then what our clients make of it.
        refused = [predict(endpoints, "digits-bulk", PNG, IMAGE, timeout=REQUEST_TIMEOUT) for _ in range(3)]
        assert [reply.status_code for reply in refused] == [503] * 3
        assert all(NO_WORKER in reply.json()["message"] for reply in refused)
        key_args = ["--config", str(fault_server.server.config), "--key-file", str(endpoints.key_file)]
        assert rest_main(["--model", "digits-bulk", str(PNG_FILE), *key_args]) == 1
        assert f"HTTP 503 from {endpoints.prediction_url('digits-bulk')}: queue full (job_queue_size={JOB_QUEUE_SIZE})" in (
            capsys.readouterr().err
        )
        impatient = job_config(fault_server, tmp_path / "impatient", told.append, patience=0.5, first_delay=0.1)
        with pytest.raises(JobError, match=rf"failed \d+ times .*HTTP 503: queue full \(job_queue_size={JOB_QUEUE_SIZE}\)"):
            run_job(impatient)

        told.clear()
        job = pool.submit(run_job, job_config(fault_server, tmp_path, told.append))
        wait_until(lambda: bool(told), "the job retried")  # it got a 503 too, and backs off
        stall.release()
        summary = job.result(timeout=JOB_TIMEOUT)
        assert [f.result().status_code for f in [held, *queued]] == [200] * (JOB_QUEUE_SIZE + 1)
    check_job(summary, tmp_path)
    assert f"HTTP 503: queue full (job_queue_size={JOB_QUEUE_SIZE})" in told[0]
    answers_correctly(fault_server, "digits-bulk")
    report("queue full", queued=JOB_QUEUE_SIZE, refused_503=len(refused), job_retries=len(told), job_rows=summary.predicted)


def test_workers_killed_mid_batch_under_stream_load_and_a_batch_job(fault_server, tmp_path):
    told: list[str] = []
    with (
        fault_server.stalled("digits") as stream,
        fault_server.stalled("digits-bulk") as bulk,
        ThreadPoolExecutor(2) as pool,
    ):
        load = pool.submit(stream_load, fault_server, 150)
        job = pool.submit(run_job, job_config(fault_server, tmp_path, told.append))
        victims = {"digits": stream.pid(), "digits-bulk": bulk.pid()}  # each holds a batch of this load
        killed = time.monotonic()
        for pid in victims.values():
            os.kill(pid, signal.SIGKILL)
        answers = load.result()
        summary = job.result(timeout=JOB_TIMEOUT)
        job_done = time.monotonic() - killed
    check_job(summary, tmp_path)
    # The killed batches' requests get TorchServe's "Worker died.": 507 when its WorkerThread has already read the
    # exit status 137, else 500 (a race inside TorchServe 0.12); the other stream worker serves the rest.
    codes = tally(answers)
    died = [a for a in answers if a.reply.status_code != 200]
    assert set(codes) <= {200, 500, 507} and 1 <= len(died) <= CLIENTS, codes
    assert all(a.reply.json()["message"] == WORKER_DIED for a in died), [a.reply.text for a in died]
    assert told and all(WORKER_DIED in line for line in told)
    replaced = wait_until(
        lambda: all(
            (state := lane_state(fault_server, lane)).ready_workers == state.workers and victims[lane] not in state.worker_pids
            for lane in LANES
        ),
        "killed workers replaced",
    )
    for lane in LANES:
        answers_correctly(fault_server, lane)
    report(
        "SIGKILL mid-batch",
        stream=dict(codes),
        job_retries=len(told),
        job_rows=summary.predicted,
        job_done_after_kill_s=round(job_done, 1),
        all_workers_back_after_s=round(job_done + replaced, 1),
    )


def test_a_forward_that_hangs_is_cut_off_at_its_lanes_timeout_and_its_worker_replaced(fault_server, tmp_path):
    """The stream lane's hung request fails at the lane's own timeout (handler.response_timeout_s, the worker
    ends itself); the bulk lane's chunk keeps the archive's longer responseTimeout (TorchServe kills the worker)."""
    told: list[str] = []
    with (
        fault_server.stalled("digits", seconds=600) as stream,
        fault_server.stalled("digits-bulk", seconds=600) as bulk,
        ThreadPoolExecutor(2) as pool,
    ):
        load = pool.submit(stream_load, fault_server, 60)
        job = pool.submit(run_job, job_config(fault_server, tmp_path, told.append))
        hung = {"digits": stream.pid(), "digits-bulk": bulk.pid()}  # never released: only the timeouts end them
        bulk_hung = time.monotonic()
        started = time.monotonic()
        answers = load.result()
        wait_until(lambda: not _alive(hung["digits-bulk"]), "hung bulk worker killed by TorchServe", 120)
        bulk_cut = time.monotonic() - bulk_hung
        summary = job.result(timeout=JOB_TIMEOUT)
        job_done = time.monotonic() - started
    check_job(summary, tmp_path)
    codes = tally(answers)
    assert set(codes) <= {200, 500} and 1 <= codes[500] <= CLIENTS
    assert all(a.reply.json()["message"] == WORKER_DIED for a in answers if a.reply.status_code == 500)
    cut_off = max(a.latency_ms for a in answers if a.reply.status_code == 500) / 1000
    # The stream lane's timeout plus the watch's poll, well before the archive's responseTimeout.
    assert STREAM_TIMEOUT <= cut_off < RESPONSE_TIMEOUT, cut_off
    assert bulk_cut >= RESPONSE_TIMEOUT - 1, bulk_cut  # measured from when the test saw the stall: up to a poll late
    assert told and all(WORKER_DIED in line for line in told)
    assert not _alive(hung["digits"])
    for lane in LANES:
        answers_correctly(fault_server, lane)
    report(
        "hang past the lanes' timeouts",
        stream=dict(codes),
        stream_timeout_s=STREAM_TIMEOUT,
        hung_stream_request_answered_after_s=round(cut_off, 1),
        bulk_response_timeout_s=RESPONSE_TIMEOUT,
        hung_bulk_worker_gone_after_s=round(bulk_cut, 1),
        job_retries=len(told),
        job_rows=summary.predicted,
        job_done_s=round(job_done, 1),
    )


def test_the_frontend_restarted_under_a_batch_job(fault_server, tmp_path, capsys):
    keys = fault_server.endpoints.key_file.read_text()
    args = [
        *("--model", "digits", "--input", str(write_jsonl(tmp_path / "rows.jsonl", ROWS))),
        *("--output", str(tmp_path / "out.jsonl"), "--chunk-size", "25", "--concurrency", "2", "--retry-for", "600"),
        *("--config", str(fault_server.server.config), "--key-file", str(fault_server.endpoints.key_file), "--no-progress"),
    ]
    with fault_server.stalled("digits-bulk") as stall, ThreadPoolExecutor(1) as pool:
        job = pool.submit(batch_job_main, args)  # the command, as a user runs it
        stall.pid()  # a chunk of the job is mid-batch: the stop cuts it off
        stopped = time.monotonic()
        fault_server.server.restart(LANES)
        restarted = time.monotonic() - stopped
        assert job.result(timeout=JOB_TIMEOUT) == EXIT_OK
        job_done = time.monotonic() - stopped
    told = [line.removeprefix("retrying ") for line in capsys.readouterr().err.splitlines() if line.startswith("retrying ")]
    rows = check_results(tmp_path)
    assert told and all(_cause(line) == "no answer" or _cause(line).startswith("HTTP 5") for line in told)
    assert fault_server.endpoints.key_file.read_text() != keys  # new tokens, picked up by the job
    for lane in LANES:
        answers_correctly(fault_server, lane)
    report(
        "frontend restart",
        job_retries=len(told),
        retry_causes=dict(Counter(_cause(line) for line in told)),
        job_rows=rows,
        lanes_ready_after_s=round(restarted, 1),
        job_done_after_s=round(job_done, 1),
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _cause(retry_line: str) -> str:
    """'no answer' or 'HTTP <code>' from a retry notice ("rows 1..25: <what happened>; try 2 in 0.7s")."""
    happened = retry_line.split(": ", 1)[1]
    return "no answer" if happened.startswith("no answer") else happened.split(":")[0]
