"""The warm-ups (scripts/server/warmup.py) on a real server: `make serve`'s wrk burst that pays the frontend's JIT,
and hot-swap's warm-up of one version until its rate is steady."""

from __future__ import annotations

import shutil

import pytest

from scripts.server.warmup import burst, burst_lane, sample_body, warm_up, warm_version


def test_the_burst_goes_to_a_digits_stream_lane_where_there_is_one():
    assert burst_lane(["minilm", "minilm-bulk", "digits-bulk", "digits"]) == "digits"
    assert burst_lane(["minilm-bulk", "minilm"]) == "minilm"
    assert burst_lane(["digits-bulk"]) is None


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk: system-packages.sh test")
def test_the_burst_answers_every_request_of_a_real_lane(digits_server):
    warmed = burst(digits_server.endpoints, "digits", 1.0, connections=8)
    assert warmed is not None and warmed.lane == "digits"
    assert warmed.requests > 100 and warmed.failed == 0


def test_without_wrk_the_warm_up_says_so_and_still_warms_the_workers(digits_server, monkeypatch, capsys):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    warmed = warm_up(digits_server.endpoints, ["digits", "digits-bulk"], seconds=0.5, burst_seconds=1.0)
    assert [w.lane for w in warmed] == ["digits", "digits-bulk"]
    assert all(w.requests > 0 and w.failed == 0 for w in warmed)
    assert "wrk is not installed" in capsys.readouterr().out


def test_a_bulk_lanes_warm_up_request_is_a_chunk_of_rows():
    assert sample_body("digits").count(b"[") == 2 and sample_body("digits-bulk").count(b"[") == 257


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk: system-packages.sh test")
def test_a_versions_warm_up_goes_to_that_version_until_steady_or_its_bound(digits_server):
    for lane in ("digits", "digits-bulk"):
        warmed = warm_version(digits_server.endpoints, lane, "1.0", max_seconds=4.0, tolerance=0.5)
        assert (warmed.lane, warmed.version, warmed.failed) == (lane, "1.0", 0)
        assert 2 <= len(warmed.rates) <= 4 and warmed.requests > 0
        assert warmed.steady or warmed.seconds >= 3.0
    # A version the lane does not have: every request fails (404), and the warm-up stops after its first window.
    missing = warm_version(digits_server.endpoints, "digits", "9.9", max_seconds=4.0)
    assert missing.failed == missing.requests > 0 and len(missing.rates) == 1 and not missing.steady


def test_without_wrk_a_versions_warm_up_uses_python_clients(digits_server, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    warmed = warm_version(digits_server.endpoints, "digits", "1.0", max_seconds=2.0, tolerance=1.0, window_s=0.5)
    assert warmed.failed == 0 and warmed.requests > 0 and len(warmed.rates) >= 2 and warmed.steady
