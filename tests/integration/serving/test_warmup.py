"""`make serve`'s warm-up (scripts/server/warmup.py): the wrk burst that pays the frontend's JIT, on a real server."""

from __future__ import annotations

import shutil

import pytest

from scripts.server.warmup import burst, burst_lane, warm_up


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
