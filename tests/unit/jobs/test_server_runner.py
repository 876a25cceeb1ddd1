"""scripts/jobs/runners.py's ServerRunner.for_lane: a job's client waits for a chunk as long as TorchServe may take."""

from __future__ import annotations

from models.registry import models
from scripts.jobs.runners import ANSWER_MARGIN_S, ServerRunner
from scripts.layout import CONFIG
from scripts.server.config import ServerConfig
from scripts.server.endpoints import Endpoints


def test_a_jobs_client_waits_for_each_lane_past_its_response_timeout_and_600_s_for_an_undeclared_one(tmp_path):
    server = ServerConfig.read(CONFIG)
    endpoints = Endpoints.from_config(CONFIG, tmp_path / "key_file.json")
    for found in models().values():
        for lane in found.lanes:
            runner = ServerRunner.for_lane(endpoints, server, lane.name)
            assert runner.timeout == lane.response_timeout_s + ANSWER_MARGIN_S
            assert runner.size_limit == server.max_request_size
    assert ServerRunner.for_lane(endpoints, server, "nowhere-bulk").timeout == 600.0


def test_every_bulk_lane_has_a_limit_of_its_own_shorter_than_the_archives_backstop():
    """A bulk lane's limit (handler.response_timeout_s) counts the time its worker ran; without one only the archive's
    wall-clock responseTimeout would cut a chunk, and a starved chunk could fail for waiting."""
    for name, found in models().items():
        bulk = found.bulk_lane
        if bulk is None:
            continue
        own = found.handler_value("response_timeout_s", bulk.name)
        backstop = int(found.handler_config()["responseTimeout"])
        assert own is not None and 0 < own < backstop, (name, own, backstop)
        assert bulk.response_timeout_s == backstop, name  # what config.properties tells TorchServe is what it applies
