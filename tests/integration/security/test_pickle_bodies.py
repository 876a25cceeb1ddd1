"""No request body is ever unpickled: a pickle that creates a file when loaded, sent to both models under
every content type a client might pick, gets a 4xx and the file never appears (the server runs on this
machine, as this user, so it could create it)."""

from __future__ import annotations

import base64
import json
import pickle
from pathlib import Path

import pytest

from scripts.clients.rest import predict

CONTENT_TYPES = [
    "application/octet-stream",
    "application/python-pickle",
    "application/x-pickle",
    "application/json",
    "text/plain",
    "image/png",
    "application/vnd.instances+json",
    "application/x-www-form-urlencoded",
]


class CreatesFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def bodies(marker: Path) -> dict[str, bytes]:
    """The pickle raw (two protocols), and inside the JSON shapes each model reads."""
    raw = pickle.dumps(CreatesFile(marker), protocol=pickle.HIGHEST_PROTOCOL)
    return {
        "raw protocol 5": raw,
        "raw protocol 2": pickle.dumps(CreatesFile(marker), protocol=2),
        "b64 instance": json.dumps({"instances": [{"b64": base64.b64encode(raw).decode()}]}).encode(),
        "latin-1 text instance": json.dumps({"instances": [raw.decode("latin-1")]}).encode(),
    }


@pytest.mark.parametrize("lane", ["digits", "minilm"])
def test_a_pickle_body_is_refused_and_never_loaded(request, lane, tmp_path):
    server = request.getfixturevalue(f"{lane}_server")
    marker = tmp_path / f"unpickled-by-{lane}"
    answers = {}
    for name, body in bodies(marker).items():
        for kind in CONTENT_TYPES:
            reply = predict(server.endpoints, lane, body, kind, timeout=60)
            answers[(name, kind)] = reply.status_code
    refused = {case: status for case, status in answers.items() if 400 <= status < 500}
    # minilm embeds any JSON string as text (its latin-1 rendering of the bytes is valid text): a 200 is
    # no unpickling. Every raw pickle, every b64 one and everything sent to digits must be refused.
    accepted_as_text = {(n, k) for (n, k) in answers if lane == "minilm" and n == "latin-1 text instance"}
    assert set(answers) - set(refused) <= accepted_as_text, {c: s for c, s in answers.items() if c not in refused}
    assert not marker.exists()
