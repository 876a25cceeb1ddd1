"""scripts/jobs/runners.py's ServerRunner.for_lane: a job's client waits for a chunk as long as TorchServe may take."""

from __future__ import annotations

from models.registry import models
from scripts.jobs.runners import ANSWER_MARGIN_S, ServerRunner
from scripts.layout import CONFIG
from scripts.server.config import ServerConfig
from scripts.server.endpoints import Endpoints


def test_a_jobs_client_waits_past_its_lanes_response_timeout_for_each_round_queued_ahead(tmp_path):
    server = ServerConfig.read(CONFIG)
    endpoints = Endpoints.from_config(CONFIG, tmp_path / "key_file.json")
    for found in models().values():
        bulk = found.bulk_lane
        round_s = bulk.response_timeout_s + ANSWER_MARGIN_S
        assert ServerRunner.for_lane(endpoints, server, bulk.name).timeout == round_s
        per_round = bulk.batch_size * bulk.workers
        # one request more than a round: the last waits for the round ahead of it, then its own
        assert ServerRunner.for_lane(endpoints, server, bulk.name, per_round + 1).timeout == 2 * round_s
        assert ServerRunner.for_lane(endpoints, server, bulk.name).size_limit == server.max_request_size
        # A stream lane's config.properties figure is shorter than the default: the default stands.
        stream = found.stream_lane
        assert stream.response_timeout_s + ANSWER_MARGIN_S < 600
        assert ServerRunner.for_lane(endpoints, server, stream.name).timeout == 600.0
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
