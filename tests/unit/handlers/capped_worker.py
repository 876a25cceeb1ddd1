"""A TorchServe handler in a process whose memory is capped for real, for the out-of-memory tests.

    python -m tests.unit.handlers.capped_worker --model-dir DIR --model-file digits.onnx --rows 16384 --headroom-mb 400

Initializes the handler as a worker does (a ts Context, the metrics cache), answers a small warm-up batch, then
caps the process's address space (RLIMIT_AS) at what it holds plus --headroom-mb, so a large micro-batch cannot
allocate and every loader's runtime raises its own out-of-memory error. Then one TorchServe batch of two requests
(--rows grids, and one grid) goes through handle(). Prints one JSON object: statuses, labels, scores, the metric
lines the worker wrote and the core's out-of-memory warnings.
"""

from __future__ import annotations

import argparse
import logging
import re
import resource
import sys
from pathlib import Path

import numpy as np
import orjson

from models.digits.samples import held_out
from tests.unit.handlers.test_torchserve_handler import MODULE, make_context


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def address_space() -> int:
    return int(re.search(r"VmSize:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--model-file", required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--headroom-mb", type=int, required=True)
    args = parser.parse_args()
    handler_section = {
        "task": "digit_classification",
        "model_file": args.model_file,
        "max_batch_rows": args.rows,
        "max_request_rows": args.rows,
        "torch_threads": 1,
    }
    handler = MODULE.UnifiedHandler()
    handler.initialize(make_context(args.model_dir, 0, handler=handler_section))
    grids = np.resize(held_out()[0], (args.rows, 8, 8))
    big = {"body": {"instances": grids.tolist()}}
    small = {"body": {"instances": [grids[0].tolist()]}}
    handler.handle([small], make_context(args.model_dir, 1, handler=handler_section))  # warm: threads, arenas
    collect = Collect()
    for name in ("ts.metrics.caching_metric", "handlers.core"):
        logging.getLogger(name).addHandler(collect)
        logging.getLogger(name).setLevel(logging.INFO)
    limit = address_space() + args.headroom_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    context = make_context(args.model_dir, 2, handler=handler_section)
    answers = handler.handle([big, small], context)
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    statuses = [context.get_response_status(index)[0] for index in range(2)]
    bodies = [orjson.loads(answer) for answer in answers]
    out = {
        "statuses": statuses,
        "scores": [[row["scores"] for row in body["predictions"]] if "predictions" in body else body for body in bodies],
        "metrics": [m for m in collect.messages if m.startswith("[METRICS]")],
        "warnings": [m for m in collect.messages if "out of memory" in m],
    }
    sys.stdout.write(orjson.dumps(out).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
