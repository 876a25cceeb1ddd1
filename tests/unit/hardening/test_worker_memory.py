"""The worst requests worker_memory sends come from each lane's own limits, through its task (scripts/hardening/
worker_memory.py): every lane of every model gets its task's cases and the shared ones, each within max_request_size."""

from __future__ import annotations

import base64
import io
import math

import orjson
import pytest
from PIL import Image

from models import registry
from scripts.errors import ScriptError
from scripts.hardening import worker_memory
from scripts.hardening.worker_memory import Limits, probes_for

REQUEST_SIZE = 64 * 1024 * 1024  # config.properties' max_request_size
LANES = [lane.name for lane in registry.lanes()]


@pytest.mark.parametrize("lane", LANES)
def test_every_lane_gets_its_tasks_worst_cases_and_the_shared_ones_within_max_request_size(lane):
    limits = Limits.of(lane, REQUEST_SIZE)
    probes = probes_for(limits)
    bodies = {probe.name: probe.build(REQUEST_SIZE) for probe in probes}
    assert all(probe.lane == lane for probe in probes)
    assert all(len(body) <= REQUEST_SIZE for body in bodies.values())
    [full] = [body for name, body in bodies.items() if name.startswith("max_request_size of {}")]
    assert len(full) > REQUEST_SIZE - 8
    if limits.bytes is not None and limits.bytes < REQUEST_SIZE:
        assert limits.bytes - 8 < len(bodies["max_request_bytes of {} (parsed, then 413 on rows)"]) <= limits.bytes
    assert len(probes) >= 3 + (limits.bytes is not None and limits.bytes < REQUEST_SIZE)


def test_a_stream_lanes_cases_take_its_row_and_pixel_limits(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # the handler's decoders lower PIL's own bomb limit
    digits = {probe.name: probe for probe in probes_for(Limits.of("digits", REQUEST_SIZE))}
    rows = registry.model("digits").handler_value("max_request_rows", "digits")
    assert len(orjson.loads(digits[f"{rows} rows of 64 floats"].build(REQUEST_SIZE))["instances"]) == rows
    found = registry.model("efficientnet_lite0")
    side = math.isqrt(found.handler_value("max_image_pixels", "efficientnet_lite0"))
    photos = {probe.name: probe for probe in probes_for(Limits.of("efficientnet_lite0", REQUEST_SIZE))}
    body = photos[f"one {side}x{side} JPEG"].build(REQUEST_SIZE)
    assert Image.open(io.BytesIO(body)).size == (side, side)
    [many] = [probe for name, probe in photos.items() if "b64 JPEGs" in name]
    instances = orjson.loads(many.build(REQUEST_SIZE))["instances"]
    assert 1 < len(instances) <= found.handler_value("max_request_rows", "efficientnet_lite0")
    assert Image.open(io.BytesIO(base64.b64decode(instances[0]["b64"]))).size == (side, side)


def test_a_task_without_worst_cases_of_its_own_gets_its_models_largest_sample_to_the_lanes_limits():
    small, large = {"audio": "a" * 10}, {"audio": "a" * 1000}
    limits = Limits("new", "audio_tagging", 8, None, {}, REQUEST_SIZE, (small, large, small))
    bodies = {probe.name: probe.build(REQUEST_SIZE) for probe in probes_for(limits)}
    assert orjson.loads(bodies["8 of its largest sample (1012 bytes)"]) == {"instances": [large] * 8}
    assert orjson.loads(bodies["its largest sample alone (1012 bytes)"]) == {"instances": [large]}
    # within the lane's own bytes: 4000 bytes hold 3 of them
    narrow = Limits("new", "audio_tagging", 8, 4000, {}, REQUEST_SIZE, (large,))
    [many] = [probe for probe in probes_for(narrow) if "of its largest sample" in probe.name]
    body = many.build(REQUEST_SIZE)
    assert len(orjson.loads(body)["instances"]) == 3 and len(body) <= 4000


def test_a_task_without_worst_cases_or_samples_is_refused_with_the_fix():
    limits = Limits("new", "audio_tagging", 8, None, {}, REQUEST_SIZE)
    with pytest.raises(ScriptError, match="task 'audio_tagging' on new: its model has no samples"):
        probes_for(limits)


def test_every_task_a_model_serves_has_worst_cases():
    assert {found.task for found in registry.models().values()} <= set(worker_memory.TASK_PROBES)
