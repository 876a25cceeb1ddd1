"""The field's pieces that need no peer running: each peer's settings, the sweep's choice, answers compared with
the lane's, and a peer that completed no request or did not start reported as such (never a crash)."""

from __future__ import annotations

import json

import orjson
import pytest

from models import registry
from scripts.bench import rivals, sweep
from scripts.bench.loadgen import LoadResult
from scripts.bench.peers import bentoml_app, pytriton_app
from scripts.bench.peers.field import describe
from scripts.bench.peers.roster import peer, peers
from scripts.bench.results import ModelBench
from scripts.bench.stream import BATCH1, FLASK, FLOOR, LANE, targets
from scripts.server.config import LaneSettings

BATCHING = {"LitServe", "Ray Serve", "BentoML", "PyTriton"}


def run(connections: int, rps: float, p50: float = 1.0, p99: float = 2.0, requests: int | None = None, errors: int = 0) -> dict:
    done = round(rps * 3) if requests is None else requests
    result = LoadResult(
        "wrk 4", "closed", connections, 3.0, done, errors, rps, p50, p50, p99, p99, 0.1, extra={"timeouts": errors}
    )
    return result.__dict__ | {"extra": dict(result.extra)}


def test_every_peer_has_settings_for_every_model_and_a_sweep_that_tries_the_same_knobs():
    found = peers()
    assert [p.name for p in found] == ["Flask", "LitServe", "Ray Serve", "BentoML", "PyTriton"]
    assert {p.name for p in found if p.batching} == BATCHING
    keys = {p.key for p in found}
    for name, model in registry.models().items():
        assert set(model.bench["peers"]) <= keys, f"models/{name}/model.yaml names a peer that does not exist"
        for subject in found:
            kept, tried = subject.settings_for(name), subject.candidates_for(name)
            assert len(tried) >= 3, subject.name
            assert kept in tried and all(set(candidate) == set(kept) for candidate in tried), subject.name
            if subject.batching:  # the candidates start from the model's own stream lane batchSize
                assert tried[0]["max_batch_size"] == model.stream_lane.batch_size, (subject.name, name)
    # the folder's index picks the candidate (the sweep's best for digits: LitServe's 4th, batch 32)
    assert peer("litserve").settings_for("digits") == peer("litserve").candidates(32)[3]
    assert peer("ray").name == "Ray Serve"
    with pytest.raises(KeyError, match="no peer 'triton'"):
        peer("triton")
    assert describe({"max_batch_size": 32, "max_latency_ms": 10}) == "max_batch_size=32, max_latency_ms=10"


def test_envelopes_round_trip_the_lanes_body_and_answer():
    body = orjson.dumps({"instances": [[0.0] * 64]})
    wire = json.loads(pytriton_app.wrap(body))
    assert wire["inputs"][0]["datatype"] == "BYTES" and wire["inputs"][0]["data"] == [body.decode()]
    answer = {"predictions": [{"label": 3, "scores": [0.1] * 10}]}
    assert pytriton_app.unwrap({"outputs": [{"name": "answer", "data": [json.dumps(answer)]}]}) == answer
    assert bentoml_app.unwrap([{"label": 3}]) == {"predictions": [{"label": 3}]}


def test_a_peer_must_give_the_lanes_answer_not_just_its_shape():
    lane = {"predictions": [{"label": 7, "scores": [0.0] * 9 + [1.0]}]}
    assert rivals.same_answer("digits", lane, {"predictions": [{"label": 7, "scores": [0.0] * 9 + [1.00001]}]}) is None
    assert "label 2" in rivals.same_answer("digits", lane, {"predictions": [{"label": 2, "scores": [0.0] * 10}]})
    assert "differ" in rivals.same_answer("digits", lane, {"predictions": [{"label": 7, "scores": [0.5] * 10}]})
    assert "shape" in rivals.same_answer("minilm", {"predictions": [{"embedding": [0.1] * 384}]}, {"error": "x"})


def zero_request_bench() -> ModelBench:
    """digits with the lane serving, Flask completing no request at 64 connections, PyTriton never started."""
    bench = ModelBench("digits", LaneSettings(batch_size=32, max_batch_delay=1, response_timeout=30, workers=2), 2)
    bench.pipeline_cpu_ms, bench.floor_cpu_ms = 0.04, 0.08
    for system, rates in ((LANE, (300, 1200, 3800, 9000)), (BATCH1, (900, 1800, 1800, 1800)), (FLOOR, (700, 2300, 6700, 18000))):
        bench.closed[system] = [run(c, r) for c, r in zip((1, 4, 16, 64), rates, strict=True)]
    bench.closed[FLASK] = [run(1, 900), run(4, 2900), run(16, 2900), run(64, 0.0, 0, 0, requests=0, errors=64)]
    bench.closed["LitServe"] = [run(1, 300, p50=3.2), run(4, 900), run(16, 1100), run(64, 0.0, requests=0, errors=12)]
    bench.closed["Ray Serve"] = [run(1, 250, p50=2.0), run(4, 800), run(16, 1500), run(64, 2000, p99=30.0)]
    bench.failed["PyTriton"] = "ServerError: pytriton_app exited with 1 before answering"
    return bench


def test_a_peer_that_completed_no_request_is_a_row_that_says_so_not_a_crash():
    bench = zero_request_bench()
    rows = {t.name: t for t in targets(bench, 64)}
    flask_top = rows["lane / Flask at 64 connections"]
    assert flask_top.value is None and not flask_top.met
    assert (
        flask_top.row() == "| lane / Flask at 64 connections | not measured (Flask: no requests completed) | >= 2x | **missed** |"
    )
    assert rows["lane / Flask at 16 connections"].value == pytest.approx(3800 / 2900)
    assert rivals.cell(bench.run(FLASK, 64)) == "no requests completed (64 errors, 64 timeouts)"
    assert rivals.cell(bench.run("PyTriton", 64)) == "not run"


def test_issue_21_targets_compare_with_the_best_batching_peer_that_served():
    bench = zero_request_bench()
    # LitServe completed nothing at 64 connections and PyTriton did not start: Ray Serve is the best there.
    assert rivals.best_peer(bench, BATCHING, 64) == "Ray Serve"
    assert rivals.best_peer(bench, BATCHING, 1, by="p50_ms") == "Ray Serve"
    rows = rivals.field_targets(bench, BATCHING, 64)
    assert rows[0] == (
        "digits lane / best batching peer (Ray Serve) req/s at 64 connections",
        "4.50x (9,000 vs 2,000)",
        ">= 1x",
        "met",
    )
    assert rows[1][0] == "digits lane p99 at 64 connections vs Ray Serve's" and rows[1][3] == "met"
    assert rows[2] == ("digits lane p50 minus the best batching peer's (Ray Serve) at 1 connection", "-1.00 ms (1.00 vs 2.00 ms)",
                       "<= +1.5 ms", "met")  # fmt: skip
    section = rivals.field_model_section(bench, peers(), 64, "2026-11-30")
    assert section.startswith("### digits (`make bench` of 2026-11-30)")
    assert "| PyTriton | " in section and "did not run" in section
    assert "- PyTriton: `ServerError: pytriton_app exited with 1 before answering`" in section
    assert "no requests completed" in section  # LitServe's row at 64 connections


def test_with_no_batching_peer_serving_the_targets_say_not_measured():
    bench = zero_request_bench()
    del bench.closed["Ray Serve"]
    assert rivals.field_targets(bench, BATCHING, 64) == [
        (
            "digits lane against the best batching peer at 64 connections",
            "no batching peer completed a request",
            "-",
            "not measured",
        )
    ]


def test_the_sweep_keeps_the_most_requests_at_the_top_load_and_the_lower_p99_when_close():
    slow = sweep.Trial({"a": 1}, {1: run(1, 300), 64: run(64, 1000, p99=10)})
    fast = sweep.Trial({"a": 2}, {1: run(1, 300), 64: run(64, 2000, p99=40)})
    steady = sweep.Trial({"a": 3}, {1: run(1, 300), 64: run(64, 1960, p99=20)})
    broken = sweep.Trial({"a": 4}, {}, failed="ServerError: no")
    assert sweep.best([slow, fast, broken], 64) is fast
    assert sweep.best([slow, fast, steady, broken], 64) is steady
    assert sweep.best([broken], 64) is None
    assert sweep.kept_now("flask", "digits", peer("flask").settings_for("digits"))
    assert not sweep.kept_now("flask", "digits", {"workers": 99, "threads": 1})


def test_the_sweep_section_shows_the_best_the_kept_and_the_failed_candidates():
    def trial(settings, rate, failed=""):
        runs = {} if failed else {"1": run(1, 100), "64": run(64, rate)}
        return {"settings": settings, "runs": runs, "failed": failed}

    trials = [trial({"m": 10}, 500), trial({"m": 100}, 900), trial({"m": 1}, 0, "boom"), trial({"m": 5}, 400)]
    data = {
        "peer": "BentoML",
        "date": "2026-11-30",
        "seconds": 2.0,
        "warmup": 1.0,
        "connections": [1, 64],
        "models": {"digits": trials},
    }
    text = sweep.section(
        {"bentoml": data},
        "digits",
        kept=lambda key, model, settings: (key, model, settings) == ("bentoml", "digits", {"m": 10}),
    )
    assert text.startswith("### digits\n")
    assert "BentoML: run 2026-11-30, 2 s per point after a 1 s warm-up." in text
    assert "| BentoML | digits | m=10 | 100, 1.0 / 2.0 | 500, 1.0 / 2.0 | kept (of 4 tried) |" in text
    assert "| BentoML | digits | m=100 | 100, 1.0 / 2.0 | 900, 1.0 / 2.0 | best (of 4 tried) |" in text
    assert "| BentoML | digits | m=1 | failed: boom | - |  |" in text
    assert "m=5" not in text
    # a later sweep of another model keeps this one's date, and its own part names only its own rows
    data["models"]["minilm"] = [trial({"m": 7}, 50)]
    data["runs"] = {"minilm": {"date": "2026-12-04", "seconds": 3.0, "warmup": 1.0}}
    other = sweep.section({"bentoml": data}, "minilm", kept=lambda *_: False)
    assert "BentoML: run 2026-12-04, 3 s per point after a 1 s warm-up." in other and "| digits |" not in other
    assert "BentoML: run 2026-11-30" in sweep.section({"bentoml": data}, "digits")
