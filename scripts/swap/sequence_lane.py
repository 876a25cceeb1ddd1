"""A stateful lane (`digits-seq`) so gRPC StreamPredictions2 works: same weights and handler, sequence batching on.

    python -m scripts.swap.sequence_lane                 # build model_store/digits-seq.mar, register it on `make serve`
    python -m scripts.swap.sequence_lane --model minilm  # the same for another model's archive

TorchServe 0.12 answers StreamPredictions2 only for models with sequence batching: each message needs a
sequence_id, and the frontend queues a stream's messages in that sequence's job group. The handler stays
stateless (it never reads the sequence id); the variant only adds TorchServe's top-level keys to the
archive's model-config.yaml. The lane is registered on demand, not loaded by config.properties, so
`make serve` keeps its two lanes per model and the hot-swap (which swaps those lanes) is unaffected.
"""

from __future__ import annotations

from pathlib import Path

from models import registry
from scripts import cli
from scripts.archive.reader import MarFile
from scripts.archive.variant import write_variant
from scripts.errors import ArchiveError
from scripts.layout import MODEL_STORE
from scripts.server.config import LaneSettings
from scripts.server.endpoints import Endpoints
from scripts.swap.management import ManagementApi

SUFFIX = "-seq"
LANE = LaneSettings(batch_size=16, max_batch_delay=5, response_timeout=30, workers=1)
# TorchServe reads these from the archive only. Each open stream is one sequence (job group):
# - maxNumSequence: streams served at once; a stream beyond that waits for a slot.
# - sequenceMaxIdleMSec: a sequence with nothing queued for this long is dropped; TorchServe does not
#   drop it when the stream closes, so a finished stream holds its slot this long. A long-lived stream
#   that idles longer simply gets a fresh job group with its next message.
# - maxSequenceJobQueueSize: messages one stream may have queued; GrpcClient.stream2's window stays below.
# batchSize/maxBatchDelay/workers are repeated here because the archive's values win over the register call.
SEQUENCE_CONFIG = {
    "sequenceBatching": True,
    "maxNumSequence": 32,
    "sequenceMaxIdleMSec": 5000,
    "maxSequenceJobQueueSize": 16,
    "batchSize": LANE.batch_size,
    "maxBatchDelay": LANE.max_batch_delay,
    "minWorkers": LANE.workers,
    "maxWorkers": LANE.workers,
}


def lane_name(model: str) -> str:
    return model + SUFFIX


def write_sequence_archive(source: Path, target: Path) -> Path:
    """`source` (a built .mar) copied to `target` with sequence batching switched on."""
    return write_variant(source, target, {}, SEQUENCE_CONFIG)


def add_sequence_lane(endpoints: Endpoints, model_store: Path, model: str) -> str:
    """Build `<model>-seq.mar` next to `<model>.mar` in `model_store` and register it; returns the lane name."""
    source = model_store / f"{model}.mar"
    if not source.exists():
        raise ArchiveError(f"{source} is missing: run `make archive` first")
    MarFile(source).verify_digest()  # the variant gets a digest of its own: its source must be a built archive
    lane = lane_name(model)
    write_sequence_archive(source, model_store / f"{lane}.mar")
    ManagementApi(endpoints).register(lane, model_store / f"{lane}.mar", LANE)
    return lane


def main() -> int:
    parser = cli.parser_for(__doc__)
    registry.add_model_option(parser, "the archive model_store/<model>.mar to serve statefully")
    parser.add_argument("--model-store", type=Path, default=MODEL_STORE)
    cli.add_server_options(parser)
    args = parser.parse_args()
    lane = add_sequence_lane(Endpoints.from_config(args.config, args.key_file), args.model_store, args.model)
    print(f"registered {lane}: use GrpcClient.stream2({lane!r}, ...)")
    return 0


if __name__ == "__main__":
    cli.run(main)
