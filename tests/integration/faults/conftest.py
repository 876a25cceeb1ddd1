"""One TorchServe for the fault tests, of their own (they kill its workers, fill its queue and restart it):
digits' two lanes from a copy of digits.mar whose entry point is the stalling fixture handler."""

from __future__ import annotations

import contextlib
import json
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scripts.archive.reader import MANIFEST
from scripts.archive.variant import write_variant
from scripts.layout import MODEL_STORE
from scripts.server.endpoints import Endpoints
from scripts.server.process import Server
from scripts.server.temporary import only_lanes_of, serving_in
from tests.integration.faults.stalling_handler import FOLDER_KEY

HANDLER = Path(__file__).with_name("stalling_handler.py")
# TorchServe 0.12 takes responseTimeout from the archive's model-config.yaml for both lanes: the bulk lane's
# timeout here. The stream lane has its own, shorter one (handler.response_timeout_s, handlers/torchserve/lane_timeout.py).
# Short, so a hang ends soon; the stream's long enough that the other tests' stalls end before it.
RESPONSE_TIMEOUT = 20
STREAM_TIMEOUT = 10
# Small, so a test fills a lane's queue with a handful of requests (config.properties' job_queue_size).
JOB_QUEUE_SIZE = 6
LANES = ["digits", "digits-bulk"]


def stalling_archive(target: Path, stall_folder: Path) -> Path:
    """digits.mar with short timeouts (responseTimeout, the stream lane's own) and stalling_handler.py as its entry point."""
    top = {"responseTimeout": RESPONSE_TIMEOUT, FOLDER_KEY: str(stall_folder)}
    handler = {"response_timeout_s": {"default": STREAM_TIMEOUT, "digits-bulk": None}}
    staged = write_variant(MODEL_STORE / "digits.mar", target.with_name("staged.mar"), handler, top)
    with zipfile.ZipFile(staged) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as new:
        for entry in old.infolist():
            data = old.read(entry)
            if entry.filename == MANIFEST:
                manifest = json.loads(data)
                manifest["model"]["handler"] = HANDLER.name
                data = json.dumps(manifest, indent=2).encode()
            new.writestr(entry, data)
        new.write(HANDLER, HANDLER.name)
    staged.unlink()
    return target


@dataclass(frozen=True)
class Stall:
    """One armed stall: `pid()` once a worker holds a batch, `release()` lets it answer."""

    path: Path

    def pid(self, timeout: float = 120) -> int:
        deadline = time.monotonic() + timeout
        while not self.path.exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"no worker stalled ({self.path} not written) within {timeout:.0f}s")
            time.sleep(0.02)
        return int(self.path.read_text())

    def release(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class FaultServer:
    """The stalling archive's server, and the folder whose files tell its handler which lane to stall."""

    server: Server
    stall_folder: Path

    @contextlib.contextmanager
    def stalled(self, lane: str, seconds: float = 120) -> Iterator[Stall]:
        """The next batch of `lane` stalls up to `seconds` (stalling_handler.py); disarmed and released on exit."""
        switch = self.stall_folder / lane
        switch.write_text(str(seconds))
        stall = Stall(self.stall_folder / f"{lane}.stalled")
        try:
            yield stall
        finally:
            switch.unlink(missing_ok=True)
            stall.release()

    @property
    def endpoints(self) -> Endpoints:
        return self.server.endpoints


@pytest.fixture(scope="module")
def fault_server(tmp_path_factory) -> Iterator[FaultServer]:
    folder = tmp_path_factory.mktemp("faults")
    stall_folder = folder / "stalls"
    stall_folder.mkdir()
    archive = stalling_archive(folder / "stalling-digits.mar", stall_folder)
    overrides = {**only_lanes_of("digits.mar"), "job_queue_size": str(JOB_QUEUE_SIZE)}
    with serving_in(folder / "server", {"digits.mar": archive}, overrides) as server:
        yield FaultServer(server, stall_folder)
