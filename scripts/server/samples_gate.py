"""The samples gate: a lane must answer its model's samples (models/<name>/samples.json) as they must be answered
before it gets traffic. Two callers: hot-swap's gate on a new version (scripts/swap/hot_swap.py), whose requests go
to /predictions/<lane>/<version>, so the gate talks to the new version only while the old one still serves everyone
else; and the pod's warm-up (scripts/container/warm.py), which gates every lane before the readiness marker, so a
pod whose lanes answer wrongly stays out of its Service. Every model has a gate: its own samples, compared as its
samples.json says (models/registry.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson
import requests

from models import registry
from scripts.layout import JSON
from scripts.server.endpoints import Endpoints, predict


@dataclass
class GateResult:
    lane: str
    version: str | None
    min_agreement: float = 1.0
    rows: int = 0
    agreeing: int = 0
    problems: list[str] = field(default_factory=list)  # no answer, a refused request, a missing prediction
    disagreements: list[str] = field(default_factory=list)  # answers that differ from the sample's (first few kept)

    @property
    def agreement(self) -> float:
        return self.agreeing / self.rows if self.rows else 0.0

    @property
    def passed(self) -> bool:
        return not self.problems and self.rows > 0 and self.agreement >= self.min_agreement

    def summary(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        if self.problems:
            detail = "; ".join(self.problems[:3])
        else:
            detail = f"{self.agreement:.1%} of {self.rows} samples answered as expected (need {self.min_agreement:.0%})"
            if not self.passed and self.disagreements:
                detail += ": " + "; ".join(self.disagreements[:3])
        where = f"{self.lane} {self.version}" if self.version else self.lane
        return f"gate {verdict} on {where}: {detail}"


def chunk_rows(found: registry.Model, lane: str) -> int:
    """The most instances one gate request carries on `lane`: the lane's own max_request_rows."""
    return int(found.handler_value("max_request_rows", lane) or len(found.samples().instances))


def gate(endpoints: Endpoints, lane: str, version: str | None = None) -> GateResult:
    """Every sample of the lane's model to /predictions/<lane>[/<version>] (default: the lane's default version),
    each answer compared with its own."""
    found, _ = registry.lane(lane)
    samples = found.samples()
    result = GateResult(lane, version, samples.min_agreement)
    step = chunk_rows(found, lane)
    for start in range(0, len(samples.instances), step):
        instances, answers = samples.instances[start : start + step], samples.answers[start : start + step]
        body = orjson.dumps({"instances": list(instances)})
        try:
            reply = predict(endpoints, lane, body, JSON, version, timeout=120)
        except requests.RequestException as error:
            result.problems.append(f"no answer: {error}")
            return result
        if reply.status_code != 200:
            result.problems.append(f"HTTP {reply.status_code}: {reply.text[:200]}")
            return result
        try:
            predictions = reply.json().get("predictions")
        except (ValueError, AttributeError):
            predictions = None
        if not isinstance(predictions, list) or len(predictions) != len(answers):
            result.problems.append(f"expected {len(answers)} predictions, got {str(predictions)[:80]}")
            return result
        for position, (prediction, answer) in enumerate(zip(predictions, answers, strict=True), start):
            problem = samples.problem(prediction, answer)
            result.rows += 1
            result.agreeing += problem is None
            if problem and len(result.disagreements) < 3:
                result.disagreements.append(f"sample {position}: {problem}")
    return result


def probe(lane: str) -> bytes:
    """One small valid request of the lane's model: the drain's barrier (see hot_swap.drain)."""
    found, _ = registry.lane(lane)
    return orjson.dumps({"instances": found.samples().request(1)})
