"""Hot-swap under load: REST and gRPC clients keep sending while digits goes 1.0 -> 2.0 -> 1.0.

Which version answered is told by the scores: 1.0 and 2.0 are trained from different seeds, so the same
image gets clearly different score vectors, identical (to float noise) within one version.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest
import requests
import torch

from models.digits.network import DigitsNet
from models.digits.samples import grid_png, held_out
from models.digits.train import export
from scripts.archive.build import build
from scripts.clients.grpc_client import GrpcClient, PredictionError
from scripts.clients.rest import predict
from scripts.server.temporary import only_lanes_of
from scripts.swap.hot_swap import Swapper, SwapRefused
from scripts.swap.management import ManagementApi, ManagementError
from tests.integration.conftest import start_server

SAMPLES = 8
REQUEST_TIMEOUT = 30  # seconds: a request slower than this counts as hung
# Both versions are confident, so raw scores can agree to 1e-4; log-scores tell them apart by far more.
SAME_VERSION = 1e-3  # max |log-score difference| between two answers of one version (batching noise)


@pytest.fixture(scope="module")
def swap_server(tmp_path_factory):
    # Only digits' two lanes: config.properties loads other models too.
    yield from start_server(tmp_path_factory.mktemp("hot_swap"), ["digits.mar", "digits-2.0.mar"], only_lanes_of("digits.mar"))


@pytest.fixture(scope="module")
def swapper(swap_server) -> Swapper:
    return Swapper(swap_server.endpoints, swap_server.server.config, swap_server.model_store)


def versions(swap_server, lane="digits") -> dict[str, bool]:
    return {state.version: state.default for state in ManagementApi(swap_server.endpoints).versions(lane)}


@dataclass
class Answer:
    sent: float
    received: float
    sample: int
    via: str = "rest"
    scores: list[float] | None = None
    error: str | None = None


class Load:
    """Client threads that send single images to the stream lane until stopped, recording every answer."""

    def __init__(self, endpoints, bodies: list[bytes], rest_threads: int = 2, grpc_threads: int = 2) -> None:
        self.endpoints, self.bodies = endpoints, bodies
        self.answers: list[Answer] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._rest, args=(i,)) for i in range(rest_threads)]
        self.threads += [threading.Thread(target=self._grpc, args=(i,)) for i in range(grpc_threads)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=REQUEST_TIMEOUT + 10)

    def _rest(self, seed: int) -> None:
        self._loop(seed, "rest", lambda body: self._rest_scores(body))

    def _rest_scores(self, body: bytes) -> list[float]:
        reply = predict(self.endpoints, "digits", body, "image/png", timeout=REQUEST_TIMEOUT)
        if reply.status_code != 200:
            raise RuntimeError(f"HTTP {reply.status_code}: {reply.text[:200]}")
        return reply.json()["scores"]

    def _grpc(self, seed: int) -> None:
        with GrpcClient(self.endpoints, timeout=REQUEST_TIMEOUT) as client:
            self._loop(seed, "grpc", lambda body: client.predict("digits", body)["scores"])

    def _loop(self, seed: int, via: str, send) -> None:
        sample = seed
        while not self.stop.is_set():
            sample = (sample + 1) % len(self.bodies)
            sent = time.monotonic()
            try:
                answer = Answer(sent, 0.0, sample, via, scores=send(self.bodies[sample]))
            except (requests.RequestException, PredictionError, RuntimeError) as error:
                answer = Answer(sent, 0.0, sample, via, error=f"{type(error).__name__}: {error}")
            answer.received = time.monotonic()
            with self.lock:
                self.answers.append(answer)
            time.sleep(0.01)  # leave the two shared cores some room for loading the new version


def reference_scores(endpoints, bodies: list[bytes], version: str) -> np.ndarray:
    return log_scores([predict(endpoints, "digits", body, "image/png", version).json()["scores"] for body in bodies])


def log_scores(scores) -> np.ndarray:
    return np.log(np.maximum(np.array(scores, dtype=np.float64), 1e-30))


def version_of(answer: Answer, references: dict[str, np.ndarray]) -> str | None:
    distances = {
        version: float(np.abs(log_scores(answer.scores) - ref[answer.sample]).max()) for version, ref in references.items()
    }
    version = min(distances, key=distances.get)
    return version if distances[version] <= SAME_VERSION else None


def served_by_version(endpoints, lane: str) -> dict[str, float]:
    """{version: requests the frontend counted} of `lane`, from TorchServe's /metrics (ts_inference_requests_total)."""
    text = requests.get(f"{endpoints.metrics}/metrics", timeout=30).text
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("ts_inference_requests_total{") and f'model_name="{lane}"' in line:
            version = re.search(r'model_version="([^"]*)"', line).group(1)
            counts[version] = counts.get(version, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def test_swap_and_rollback_under_load_lose_no_request(swap_server, swapper, monkeypatch):
    endpoints = swap_server.endpoints
    # What each new version had served when its set-default call went out: the gate's and the warm-up's requests.
    at_set_default: list[tuple[str, str, dict[str, float]]] = []
    set_default = ManagementApi.set_default

    def counted_set_default(api, lane, version):
        at_set_default.append((lane, version, served_by_version(endpoints, lane)))
        return set_default(api, lane, version)

    monkeypatch.setattr(ManagementApi, "set_default", counted_set_default)
    grids, _ = held_out(SAMPLES)
    bodies = [grid_png(grid) for grid in grids]
    references = {"1.0": reference_scores(endpoints, bodies, "1.0")}
    with Load(endpoints, bodies) as load:
        time.sleep(2)
        served_before = {"2.0": {lane: served_by_version(endpoints, lane) for lane in ("digits", "digits-bulk")}}
        forward = swapper.swap("digits", swap_server.model_store / "digits-2.0.mar")
        references["2.0"] = reference_scores(endpoints, bodies, "2.0")
        time.sleep(2)
        served_before["1.0"] = {lane: served_by_version(endpoints, lane) for lane in ("digits", "digits-bulk")}
        back = swapper.rollback("digits")
        time.sleep(2)
    answers = load.answers

    # The versions are told apart by their scores: every sample must differ clearly between them.
    assert np.abs(references["1.0"] - references["2.0"]).max(axis=1).min() > 100 * SAME_VERSION
    failures = [answer for answer in answers if answer.error is not None]
    assert failures == [], failures[:5]
    assert max(answer.received - answer.sent for answer in answers) < REQUEST_TIMEOUT
    answered_by = [version_of(answer, references) for answer in answers]
    assert None not in answered_by  # every answer came from 1.0 or 2.0, nothing else

    # After set-default returned, no request sent later is answered by the old version.
    to_two, to_one = forward.default_set["digits"], back.default_set["digits"]
    # A request stamped just before the rollback's set-default may reach the server just after it and be
    # answered by 1.0 legitimately: the 2.0 window holds the requests that were sent and answered inside it.
    between = [
        v for a, v in zip(answers, answered_by, strict=True) if to_two <= a.sent and a.received < back.default_requested["digits"]
    ]
    after = [v for a, v in zip(answers, answered_by, strict=True) if a.sent >= to_one]

    def late(window_start, old):
        return [
            (a.via, round(a.sent - window_start, 3), round(a.received - window_start, 3))
            for a, v in zip(answers, answered_by, strict=True)
            if a.sent >= window_start and v == old
        ]

    assert between and set(between) == {"2.0"}, late(to_two, "1.0")
    assert after and set(after) == {"1.0"}, late(to_one, "2.0")
    during = [a for a in answers if forward.started <= a.sent <= back.finished]
    assert len(during) >= 20  # the swaps really happened under traffic

    assert versions(swap_server) == {"1.0": True}
    assert versions(swap_server, "digits-bulk") == {"1.0": True}
    assert swapper.history() == {"digits": []}

    # The warm-up gate: between the swap's start and its set-default, the new version of each lane served the
    # warm-up's requests (sent to /predictions/<lane>/<version>) on top of the gate's one (TorchServe's counter is
    # per version label and outlives an unregistered version, hence the difference); the warm-up ran until steady
    # or its bound.
    for report in (forward, back):
        warmed = {w.lane: w for w in report.warmups}
        assert sorted(warmed) == ["digits", "digits-bulk"] and all(w.version == report.new_version for w in warmed.values())
        assert all(w.failed == 0 and len(w.rates) >= 2 for w in warmed.values())
        assert all(w.steady or w.seconds >= swapper.warm_seconds - 1.5 for w in warmed.values())
        assert warmed["digits"].requests > 500  # wrk at 16 connections for a second at least
        for lane, w in warmed.items():
            [counts] = [c for name, v, c in at_set_default if (name, v) == (lane, report.new_version)]
            served = counts.get(report.new_version, 0) - served_before[report.new_version][lane].get(report.new_version, 0)
            assert served >= w.requests + 1, (lane, counts, w)
    print(
        "warm-ups before set-default: "
        + "; ".join(f"{w.summary()}" for report in (forward, back) for w in report.warmups)
        + "; counted at set-default: "
        + "; ".join(f"{lane} {version}: {counts}" for lane, version, counts in at_set_default)
    )
    print(
        f"\nhot-swap under load: {len(answers)} requests ({len(during)} sent during the two swaps), "
        f"{len(failures)} failed; register -> old unregistered: 1.0->2.0 {forward.seconds:.1f}s, 2.0->1.0 {back.seconds:.1f}s"
    )


def broken_archive(store, build_dir, version: str, model_file: bytes | None) -> str:
    """digits-<version>.mar whose model is `model_file` (corrupt bytes), or untrained weights when None."""
    target = build_dir / "digits" / version / "digits.pt2"
    target.parent.mkdir(parents=True)
    if model_file is None:
        torch.manual_seed(0)
        export(DigitsNet().eval(), target)  # answers well-formed but wrong (about 10% right)
    else:
        target.write_bytes(model_file)
    return build("digits", version, store, build_dir, check_answers=False).name  # make archive would refuse it


@pytest.mark.parametrize("version, model_file", [("9.1", b"not a torch.export program" * 100), ("9.2", None)])
def test_a_broken_archive_is_refused_and_the_default_stays(swap_server, swapper, tmp_path, version, model_file):
    name = broken_archive(swap_server.model_store, tmp_path, version, model_file)
    with pytest.raises(SwapRefused) as raised:
        swapper.swap("digits", swap_server.model_store / name)
    reason = "Failed to start workers" if model_file else "gate FAILED"
    assert reason in str(raised.value) and "digits stays on 1.0" in str(raised.value)
    assert versions(swap_server) == {"1.0": True}
    assert versions(swap_server, "digits-bulk") == {"1.0": True}
    reply = predict(swap_server.endpoints, "digits", grid_png(held_out(1)[0][0]), "image/png")
    assert reply.status_code == 200 and reply.json()["label"] == held_out(1)[1][0]


def test_an_existing_version_and_a_bad_token_are_refused_clearly(swap_server, swapper):
    with pytest.raises(SwapRefused, match=r"version 1.0 of 'digits' is already registered \(registered: 1.0\)"):
        swapper.swap("digits", swap_server.model_store / "digits.mar")
    wrong = dataclasses.replace(swap_server.endpoints, key_file=swap_server.workdir / "stale_keys.json")
    wrong.key_file.write_text(json.dumps({"inference": {"key": "old"}, "management": {"key": "old"}}))
    with pytest.raises(ManagementError, match="refused the management token from .*stale_keys.json"):
        dataclasses.replace(swapper, endpoints=wrong).swap("digits", swap_server.model_store / "digits-2.0.mar")
    with pytest.raises(ManagementError, match="model 'digits-x' is not registered"):
        ManagementApi(swap_server.endpoints).versions("digits-x")
