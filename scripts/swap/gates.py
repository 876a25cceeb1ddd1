"""The warm-up gate of a hot-swap: a new version must answer held-out data well before it gets traffic.

Requests go to /predictions/<lane>/<version>, so the gate talks to the new version only while the old
one still serves everyone else. Each model that can be swapped has a gate here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import requests

from scripts.clients.rest import predict
from scripts.errors import ScriptError
from scripts.layout import JSON
from scripts.server.endpoints import Endpoints

MIN_ACCURACY = 0.95
GATE_ROWS = 200


@dataclass
class GateResult:
    lane: str
    version: str
    rows: int = 0
    correct: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.correct / self.rows if self.rows else 0.0

    @property
    def passed(self) -> bool:
        return not self.problems and self.rows > 0 and self.accuracy >= MIN_ACCURACY

    def summary(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        detail = (
            "; ".join(self.problems[:3])
            if self.problems
            else f"{self.accuracy:.1%} of {self.rows} held-out rows correct (need {MIN_ACCURACY:.0%})"
        )
        return f"gate {verdict} on {self.lane} {self.version}: {detail}"


def digits_check(result, label: int) -> str | None:
    """What is wrong with one digits result, or None: {"label": 0..9, "scores": 10 floats summing to 1}."""
    if not isinstance(result, dict) or set(result) != {"label", "scores"}:
        return f"expected {{'label', 'scores'}}, got {str(result)[:80]}"
    scores = result["scores"]
    if not isinstance(scores, list) or len(scores) != 10 or not all(isinstance(s, float) and math.isfinite(s) for s in scores):
        return f"expected 10 finite float scores, got {str(scores)[:80]}"
    if abs(sum(scores) - 1.0) > 1e-3:
        return f"scores sum to {sum(scores):.4f}, expected 1"
    if result["label"] not in range(10) or scores.index(max(scores)) != result["label"]:
        return f"label {result['label']} is not the argmax of the scores"
    return None


def digits_rows(count: int) -> tuple[list, list[int]]:
    from models.digits.data import load_split  # sklearn's bundled digits: no download

    split = load_split()
    return split.test_x[:count].tolist(), split.test_y[:count].tolist()


def digits_gate(endpoints: Endpoints, lane: str, version: str, rows: int = GATE_ROWS) -> GateResult:
    grids, labels = digits_rows(rows)
    result = GateResult(lane, version)
    try:
        reply = predict(endpoints, lane, json.dumps({"instances": grids}).encode(), JSON, version, timeout=120)
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
    if not isinstance(predictions, list) or len(predictions) != len(labels):
        result.problems.append(f"expected {len(labels)} predictions, got {str(predictions)[:80]}")
        return result
    for position, (prediction, label) in enumerate(zip(predictions, labels, strict=True)):
        problem = digits_check(prediction, label)
        if problem:
            result.problems.append(f"row {position}: {problem}")
        result.rows += 1
        result.correct += problem is None and prediction["label"] == label
    return result


def digits_probe() -> bytes:
    """One small valid request: the drain's barrier (see hot_swap.drain)."""
    return json.dumps({"instances": [[0] * 64]}).encode()


GATES = {"digits": digits_gate}
PROBES = {"digits": digits_probe}


def gate_for(model: str):
    if model not in GATES:
        raise ScriptError(
            f"no warm-up gate for model {model!r}: hot-swap knows {', '.join(sorted(GATES))} (add one in scripts/swap/gates.py)"
        )
    return GATES[model], PROBES[model]
