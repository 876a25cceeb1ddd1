"""A real TorchServe: the bulk lane's workers run every thread at SCHED_IDLE with OpenMP waiting passively, the
stream lane's workers and the frontend stay normal; an unknown handler.priority is refused when the lane starts."""

from __future__ import annotations

import os
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest
import requests
import yaml

from handlers.priority import GOMP_SPINCOUNT, OMP_WAIT_POLICY, PASSIVE, SPIN_GRACE, thread_policies
from models.digits.samples import held_out
from scripts.archive.reader import MODEL_CONFIG, MarFile
from scripts.clients.rest import predict
from scripts.server.config import LaneSettings
from scripts.swap.management import ManagementApi, ManagementError


def busy(server, lane: str, rows: int) -> None:
    """A request of `rows` rows, so the worker's pass threads and torch's pool exist when its threads are read."""
    grids, _ = held_out()
    items = [g.astype(int).flatten().tolist() for g in grids]
    body = orjson.dumps({"instances": (items * (rows // len(items) + 1))[:rows]})
    reply = predict(server.endpoints, lane, body, "application/json")
    assert reply.status_code == 200, reply.text


def parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def environment(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(pair.decode(errors="replace").partition("=")[::2] for pair in pairs if b"=" in pair)


def test_every_thread_of_a_bulk_worker_is_sched_idle_and_waits_passively(digits_server):
    busy(digits_server, "digits-bulk", 1500)  # three passes of 512: the pass threads start
    (pid,) = ManagementApi(digits_server.endpoints).worker_pids("digits-bulk")
    policies = thread_policies(pid)
    names = {Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip() for tid in policies}
    assert len(policies) >= 3, names  # the main thread, the pass threads, the collector, ...
    assert set(policies.values()) == {os.SCHED_IDLE}
    assert (environment(pid)[OMP_WAIT_POLICY], environment(pid)[GOMP_SPINCOUNT]) == (PASSIVE, SPIN_GRACE)


def test_the_stream_workers_and_the_frontend_stay_at_the_normal_policy(digits_server):
    busy(digits_server, "digits", 8)
    pids = ManagementApi(digits_server.endpoints).worker_pids("digits")
    assert len(pids) == 2
    for pid in pids:
        assert set(thread_policies(pid).values()) == {os.SCHED_OTHER}
    frontend = parent(pids[0])
    assert len(thread_policies(frontend)) > 10  # the JVM: Netty's and the batchers' threads
    assert set(thread_policies(frontend).values()) == {os.SCHED_OTHER}


def with_priority(source: Path, target: Path, priority) -> Path:
    """`source` with handler.priority set to anything (scripts.archive.variant refuses to write a bad one)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as new:
        for entry in old.infolist():
            data = old.read(entry)
            if entry.filename == MODEL_CONFIG:
                config = yaml.safe_load(data)
                config["handler"]["priority"] = priority
                data = yaml.safe_dump(config, sort_keys=False).encode()
            new.writestr(entry, data)
    MarFile(target).record_digest()
    return target


def test_an_unknown_priority_is_refused_when_the_lane_starts_with_the_fix_in_the_log(digits_server):
    archive = with_priority(digits_server.model_store / "digits.mar", digits_server.model_store / "digits-low.mar", "low")
    api = ManagementApi(digits_server.endpoints, timeout=120)
    lane = LaneSettings(batch_size=1, max_batch_delay=1, response_timeout=30, workers=1)
    try:
        with pytest.raises(ManagementError):
            api.register("digits-low", archive, lane)
    finally:
        for state in api.versions("digits-low") if _registered(api, "digits-low") else []:
            api.unregister("digits-low", state.version)
    log = (digits_server.workdir / "logs" / "model_log.log").read_text(errors="replace")
    assert "handler.priority must be interactive or background, got 'low'" in log
    assert "priority: {default: interactive, digits-bulk: background}" in log


def _registered(api: ManagementApi, lane: str) -> bool:
    try:
        api.versions(lane)
    except ManagementError:
        return False
    return True


def series_sum(metrics_text: str, name: str, lane: str) -> float:
    """The sum of one lane's series `name` in TorchServe's /metrics text (0 when absent)."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(name + "{") and f'lane="{lane}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_bulk_lane_yields_to_stream_traffic_and_reports_it(digits_server):
    yielding_lane = "digits-bulk"
    metrics_url = f"{digits_server.endpoints.metrics}/metrics"
    before = series_sum(requests.get(metrics_url, timeout=30).text, "HandlerYieldHoldSeconds_count", yielding_lane)
    grids, _ = held_out(4)
    one = orjson.dumps({"instances": [grids[0].astype(int).flatten().tolist()]})
    stop = threading.Event()

    def stream() -> int:
        sent = 0
        while not stop.is_set():
            assert predict(digits_server.endpoints, "digits", one, "application/json").status_code == 200
            sent += 1
        return sent

    with ThreadPoolExecutor(2) as pool:
        senders = [pool.submit(stream) for _ in range(2)]
        for _ in range(3):
            busy(digits_server, yielding_lane, 20_000)
        stop.set()
        assert all(sender.result() > 0 for sender in senders)
    text = requests.get(metrics_url, timeout=30).text
    assert series_sum(text, "HandlerYieldHoldSeconds_count", yielding_lane) > before  # it saw the stream lane rise
    assert series_sum(text, "HandlerYieldSeconds_count", yielding_lane) >= 3
    assert series_sum(text, "HandlerYieldHoldSeconds_count", "digits") == 0  # stream lanes never yield
