"""Where TorchServe 0.12 takes a lane's job queue size, on a TorchServe of this test's own: an archive's
model-config.yaml `jobQueueSize` replaces config.properties' job_queue_size for every lane registered from that
archive, and config.properties' models= reads no such key (a jobQueueSize there changes nothing). The frontend's
heap is sized from these queues (scripts/deploy/memory.py; docs/kubernetes.md, "Memory")."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import requests

from scripts.archive.variant import write_variant
from scripts.clients.rest import predict
from scripts.server.config import ServerConfig
from scripts.server.temporary import only_lanes_of, serving_in
from tests.integration.faults.conftest import LANES, FaultServer, stalling_archive
from tests.integration.faults.test_faults import IMAGE, PNG, REQUEST_TIMEOUT, lane_state, wait_until

ARCHIVE_QUEUE, MODELS_JSON_QUEUE, SERVER_QUEUE = 3, 5, 9


def test_the_archives_job_queue_size_holds_for_both_its_lanes_and_one_request_more_gets_a_503(tmp_path):
    stall_folder = tmp_path / "stalls"
    stall_folder.mkdir()
    stalling = stalling_archive(tmp_path / "stalling.mar", stall_folder)
    archive = write_variant(stalling, tmp_path / "queued" / "digits.mar", {}, {"jobQueueSize": ARCHIVE_QUEUE})
    models = {lane: ServerConfig.read()._models_json()[lane] for lane in LANES}
    models["digits-bulk"]["1.0"]["jobQueueSize"] = MODELS_JSON_QUEUE
    overrides = {**only_lanes_of("digits.mar"), "job_queue_size": str(SERVER_QUEUE), "models": json.dumps(models)}
    with serving_in(tmp_path / "server", {"digits.mar": archive}, overrides) as server:
        endpoints = server.endpoints
        capacity = {
            lane: requests.get(f"{endpoints.management}/models/{lane}", headers=endpoints.auth("management"), timeout=30).json()[
                0
            ]["jobQueueStatus"]["remainingCapacity"]
            for lane in LANES
        }
        assert capacity == {"digits": ARCHIVE_QUEUE, "digits-bulk": ARCHIVE_QUEUE}

        lanes = FaultServer(server, stall_folder)
        send = (predict, endpoints, "digits-bulk", PNG, IMAGE)
        with lanes.stalled("digits-bulk") as stall, ThreadPoolExecutor(ARCHIVE_QUEUE + 1) as pool:
            held = pool.submit(*send, timeout=REQUEST_TIMEOUT)
            stall.pid()  # the lane's only worker holds that request: the next ones queue
            queued = [pool.submit(*send, timeout=REQUEST_TIMEOUT) for _ in range(ARCHIVE_QUEUE)]
            wait_until(lambda: lane_state(lanes, "digits-bulk").pending_requests == ARCHIVE_QUEUE, "queue filled")
            refused = predict(endpoints, "digits-bulk", PNG, IMAGE, timeout=REQUEST_TIMEOUT)
            assert refused.status_code == 503
            stall.release()
            answers = [future.result(timeout=REQUEST_TIMEOUT) for future in [held, *queued]]
        assert [(answer.status_code, answer.json()["label"]) for answer in answers] == [(200, 7)] * (ARCHIVE_QUEUE + 1)
