"""The transport floor: a TorchServe handler that answers every request with a tiny fixed JSON.

Packed at the archive root (stdlib only), so it measures TorchServe itself (Netty, the batcher, the worker
socket, the Python backend's request loop) and none of our handler's work. It sets the worker up as our handler
does: the same log levels, and our message reader (handlers/torchserve/worker_protocol.py, packed beside it) in place of
TorchServe's, so the floor is what the lane's requests cost outside the handler. `build_noop_archive()` makes the
.mar with torch-model-archiver.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

ANSWER = b'{"label":0,"scores":[1.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0]}'
JSON = "application/json"  # not scripts.layout's: this file is packed alone, stdlib only
# The worker's message reader our handler installs; stdlib only too.
READER = Path(__file__).resolve().parents[3] / "handlers" / "torchserve" / "worker_protocol.py"


def handle(data, context):
    """TorchServe's function entry point: one fixed answer per request in the batch."""
    if data is None:  # the load-time call: the worker's logging as our handler sets it (handlers/torchserve/metrics.py)
        logging.getLogger().setLevel(logging.WARNING)  # no "Backend received inference" line per batch
        logging.getLogger("ts.metrics").setLevel(logging.WARNING)  # nor TorchServe's PredictionTime line
        import worker_protocol  # packed beside this file (build_noop_archive)

        worker_protocol.install()
        return None
    for index in range(len(data)):
        context.set_response_content_type(index, JSON)
    return [ANSWER] * len(data)


def build_noop_archive(export_path: Path, name: str = "noop", version: str = "1.0") -> Path:
    """noop.mar (no model file) in `export_path`, built with the torch-model-archiver next to this Python."""
    export_path.mkdir(parents=True, exist_ok=True)
    archiver = Path(sys.executable).parent / "torch-model-archiver"
    command = [
        str(archiver if archiver.exists() else "torch-model-archiver"),
        "--model-name",
        name,
        "--version",
        version,
        "--handler",
        str(Path(__file__).resolve()),
        "--extra-files",
        str(READER),
        "--export-path",
        str(export_path),
        "--force",
    ]
    subprocess.run(command, check=True, capture_output=True)
    return export_path / f"{name}.mar"
