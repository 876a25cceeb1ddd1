"""The soak's short version: 20 s of stream traffic on every model plus batch jobs on every bulk lane,
against the session's real servers (one per model); no worker or frontend may grow past its bound (scripts/hardening/soak.py).
`make soak` runs the same for 10 minutes on a server of its own."""

from __future__ import annotations

import orjson
import pytest

from models import registry
from scripts.hardening import soak
from tests.integration.conftest import model_server

SOAK_MINUTES = 0.35  # plus the warm-up (a burst, then 5 s of the same traffic) and two 2 s pauses: about 30 s
MODELS = sorted(registry.models())
ROLES = {"frontend", *(lane.name for lane in registry.lanes())}


def lanes_of(server, model: str) -> dict[str, soak.Lane]:
    return soak.lanes_of(server.server.config, server.workdir / "key_file.json", (model,))


def test_a_short_run_of_mixed_traffic_grows_no_process_past_its_bound(request):
    servers = {model: model_server(request, model) for model in MODELS}
    lanes = {name: lane for model, server in servers.items() for name, lane in lanes_of(server, model).items()}
    first = servers[MODELS[0]]
    report = soak.soak(lanes, minutes=SOAK_MINUTES, warmup_s=5, logs=first.workdir / "logs")
    report.logs_cap_bytes = soak.LOGS_CAP_BYTES  # the session's servers log at the default settings: far below it
    print(report.text())
    assert report.failures == [], report.text()
    # Every worker of every lane and every frontend (one per server) were sampled at both ends.
    assert {p.role for p in report.processes} == ROLES
    assert sum(p.role == "frontend" for p in report.processes) == len(MODELS)
    assert all(p.end is not None and p.end.pid == p.pid for p in report.processes)
    assert all(p.start.rss_mib > 50 and p.start.fds > 0 for p in report.processes)
    # Both kinds of traffic really ran: stream requests answered on every model, batch jobs on every bulk lane.
    assert {lane: result.requests > 0 and result.errors == 0 for lane, result in report.traffic.stream.items()} == {
        model: True for model in MODELS
    }
    assert {job["model"] for job in report.traffic.jobs} == set(MODELS)
    assert all(job["predicted"] == job["rows"] for job in report.traffic.jobs)
    # Default log settings: a minute of traffic writes next to nothing (docs/observability.md, "Logs").
    assert report.logs_bytes[1] - report.logs_bytes[0] < 64 * 1024, report.logs_bytes


START = soak.Sample("digits", 1, rss_mib=300.0, fds=5)


@pytest.mark.parametrize(
    "role, end, expected",
    [
        ("digits", soak.Sample("digits", 1, 300.0 + 47.0, 5), []),  # under 48 MiB (10 % of 300 is 30)
        ("digits", soak.Sample("digits", 1, 300.0 + 49.0, 5), ["RSS grew +49.0 MiB (300 -> 349), bound 48 MiB"]),
        ("digits", soak.Sample("digits", 1, 300.0, 6), ["open fds 5 -> 6, bound +0"]),
        ("frontend", soak.Sample("frontend", 1, 300.0 + 190.0, 20), []),  # a JVM: 192 MiB or 40 %, +16 fds
        ("frontend", soak.Sample("frontend", 1, 300.0, 22), ["open fds 5 -> 22, bound +16"]),
        ("digits", None, ["is gone: it exited or was restarted during the soak"]),
    ],
)
def test_the_bounds_fail_a_process_that_grows_past_them(role, end, expected):
    start = soak.Sample(role, 1, START.rss_mib, START.fds)
    report = soak.ProcessReport(role, 1, start, end, peak_rss_mib=400.0, bound=soak.bound_for(role))
    problems = report.problems()
    assert len(problems) == len(expected) and all(text in problem for text, problem in zip(expected, problems, strict=True))


def test_a_lane_that_keeps_more_heap_than_the_bound_gets_its_slack_plus_a_margin():
    # efficientnet_lite0's workers keep 96 MiB over their resting size (model-config.yaml's heap_slack_mib)
    assert soak.bound_for("efficientnet_lite0").rss_mib == 96 + soak.SLACK_MARGIN_MIB
    assert soak.bound_for("digits-bulk").rss_mib == 48  # its slack (32, one threshold) is within the bound
    assert soak.bound_for("frontend") == soak.BOUNDS["frontend"]


def test_the_stream_request_holds_several_samples_within_the_lanes_limits():
    for model in MODELS:
        body = orjson.loads(soak.stream_body(model))
        found = registry.model(model)
        assert body["instances"] == list(found.samples().instances[: len(body["instances"])])
        assert 1 <= len(body["instances"]) <= soak.STREAM_ROWS
        assert len(soak.stream_body(model)) <= (found.handler_value("max_request_bytes", model) or 2**62)
