"""The soak's short version: 20 s of stream traffic on both models plus batch jobs on both bulk lanes,
against the session's real servers; no worker or frontend may grow past its bound (scripts/hardening/soak.py).
`make soak` runs the same for 10 minutes on a server of its own."""

from __future__ import annotations

import pytest

from scripts.hardening import soak

SOAK_MINUTES = 0.35  # plus the warm-up (a burst, then 5 s of the same traffic) and two 2 s pauses: about 30 s
ROLES = {"frontend", "digits", "digits-bulk", "minilm", "minilm-bulk"}


def lanes_of(server, model: str) -> dict[str, soak.Lane]:
    return soak.lanes_of(server.server.config, server.workdir / "key_file.json", (model,))


def test_a_short_run_of_mixed_traffic_grows_no_process_past_its_bound(digits_server, minilm_server):
    lanes = {**lanes_of(digits_server, "digits"), **lanes_of(minilm_server, "minilm")}
    report = soak.soak(lanes, minutes=SOAK_MINUTES, warmup_s=5, logs=digits_server.workdir / "logs")
    report.logs_cap_bytes = soak.LOGS_CAP_BYTES  # the session's servers log at the default settings: far below it
    print(report.text())
    assert report.failures == [], report.text()
    # Every worker of the four lanes and both frontends (one per server) were sampled at both ends.
    assert {p.role for p in report.processes} == ROLES
    assert sum(p.role == "frontend" for p in report.processes) == 2
    assert all(p.end is not None and p.end.pid == p.pid for p in report.processes)
    assert all(p.start.rss_mib > 50 and p.start.fds > 0 for p in report.processes)
    # Both kinds of traffic really ran: stream requests answered on both models, batch jobs on both bulk lanes.
    assert {lane: result.requests > 0 and result.errors == 0 for lane, result in report.traffic.stream.items()} == {
        "digits": True,
        "minilm": True,
    }
    assert {job["model"] for job in report.traffic.jobs} == {"digits", "minilm"}
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
