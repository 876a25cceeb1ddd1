"""Test fixture, packed only into the fault tests' archive (tests/integration/faults/conftest.py): the real
UnifiedHandler, except that a test can make the next batch of a lane stall.

The archive's model-config.yaml names a folder (`test_stall_folder`). A test arms a lane by writing the file
`<folder>/<lane>` (its text: the most seconds to stall). The first worker of that lane to get a batch claims
the file (a rename: one worker only), writes its pid into `<folder>/<lane>.stalled` and holds the batch,
whatever requests it carries, until the test deletes that file or the seconds run out; then it answers as
usual. So a test knows which worker is mid-batch, and when, without guessing from timings; a stall past the
lane's responseTimeout is a forward that hangs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from handlers.torchserve.torchserve_handler import UnifiedHandler

FOLDER_KEY = "test_stall_folder"


class StallingHandler(UnifiedHandler):
    def initialize(self, context) -> None:
        super().initialize(context)
        self.folder = Path(context.model_yaml_config[FOLDER_KEY])
        self.lane = context.model_name

    def answer_batch(self, data: list[dict], context) -> list[bytes]:
        claimed = self.folder / f"{self.lane}.{self.pid}.claimed"
        try:
            os.rename(self.folder / self.lane, claimed)
        except FileNotFoundError:
            return super().answer_batch(data, context)  # not armed, or another worker was first
        deadline = time.monotonic() + float(claimed.read_text())
        claimed.write_text(self.pid)
        stalled = self.folder / f"{self.lane}.stalled"
        os.replace(claimed, stalled)  # appears whole, so a test never reads it half written
        while stalled.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return super().answer_batch(data, context)
