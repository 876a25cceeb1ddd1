"""The image test and the formats bench compare answers with models/registry.largest_difference (the container's
with the in-process core's on the same archive; each format's with the fp32 export's): every number within a
tolerance, everything else exactly."""

from __future__ import annotations

import math

from models.registry import largest_difference
from scripts.image_check.image_test import SERVED_TOLERANCE


def test_numbers_anywhere_in_an_answer_are_compared_and_the_rest_must_be_equal():
    top5 = {
        "top5": [{"label": "tabby", "index": 281, "probability": 0.5}, {"label": "tiger cat", "index": 282, "probability": 0.25}]
    }
    near = {
        "top5": [
            {"label": "tabby", "index": 281, "probability": 0.5 + 3e-6},
            {"label": "tiger cat", "index": 282, "probability": 0.25},
        ]
    }
    assert math.isclose(largest_difference(near, top5), 3e-6, rel_tol=1e-6) and largest_difference(near, top5) <= SERVED_TOLERANCE
    renamed = {"top5": [{"label": "lynx", "index": 281, "probability": 0.5}, top5["top5"][1]]}
    assert largest_difference(renamed, top5) == math.inf
    assert largest_difference({"embedding": [0.1, 0.2]}, {"embedding": [0.1]}) == math.inf
    assert largest_difference({"embedding": [0.1, 0.2]}, {"vector": [0.1, 0.2]}) == math.inf
    assert largest_difference({"label": 7, "scores": [0.9, 0.1]}, {"label": 7, "scores": [0.9, 0.1]}) == 0.0
    assert largest_difference({"label": 7}, {"label": 1}) == 6.0  # a class index off by any amount fails the bound
