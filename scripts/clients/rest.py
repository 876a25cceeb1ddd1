"""REST client: send an image, a text, a JSON instances file or one of the model's samples to a lane; print the answer.

    python -m scripts.clients.rest --model efficientnet_lite0             # the lane's model's first sample
    python -m scripts.clients.rest --model minilm --sample 9              # its tenth (models/<name>/samples.json)
    python -m scripts.clients.rest --model digits tests/fixtures/digit_7.png
    python -m scripts.clients.rest --model digits-bulk tests/fixtures/digits_instances.json
    python -m scripts.clients.rest --model minilm --text "a sentence"

Exits non-zero (and prints the server's error) when the answer is not 200; a 503 from a full queue says so.
"""

from __future__ import annotations

import json
import mimetypes
import sys
from pathlib import Path

import requests

from models import registry
from scripts import cli
from scripts.errors import ConfigError
from scripts.layout import JSON
from scripts.server.config import ServerConfig
from scripts.server.endpoints import Endpoints, predict

# TorchServe 0.12 answers 503 'Model "<lane>" has no worker to serve inference request. Please use scale workers
# API to add workers. ...' both when the lane's queue already holds job_queue_size requests and when the lane has
# no worker at all (starting up, scaled to 0): docs/hardening.md, Faults.
NO_WORKER = "has no worker to serve inference request"


def content_type(path: Path) -> str:
    if path.suffix == ".json":
        return JSON
    return mimetypes.guess_type(path.name)[0] or "application/octet-stream"


def unavailable_reason(endpoints: Endpoints, lane: str, reply: requests.Response, job_queue_size: int) -> str | None:
    """What TorchServe's 'no worker' 503 means for `lane`, told apart by asking the management API whether the
    lane has workers; None for any other answer."""
    if reply.status_code != 503 or NO_WORKER not in reply.text:
        return None
    workers = _worker_count(endpoints, lane)
    if workers == 0:
        return f"{lane} has no worker (starting up, or scaled to 0 workers)"
    full = f"queue full (job_queue_size={job_queue_size})"
    return full if workers else f"{full}, or {lane} has no worker yet"


def _worker_count(endpoints: Endpoints, lane: str) -> int | None:
    try:
        reply = requests.get(f"{endpoints.management}/models/{lane}", headers=endpoints.auth("management"), timeout=5)
        return sum(len(version.get("workers", [])) for version in reply.json()) if reply.status_code == 200 else None
    except (requests.RequestException, ValueError, ConfigError):
        return None  # no management API here, or no management key: the reply alone cannot tell


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("file", nargs="?", type=Path, help='an image, a .txt or a .json {"instances": [...]} file')
    parser.add_argument("--text", help="send this text as the raw body instead of a file")
    add_lane_options(parser)
    parser.add_argument("--version", help="a model version (default: the lane's default version)")
    cli.add_server_options(parser)
    args = parser.parse_args(argv)
    if args.file is not None and args.text is not None:
        parser.error("give at most one of FILE or --text (neither: --sample)")
    endpoints = Endpoints.from_config(args.config, args.key_file)
    if args.file is None and args.text is None:
        body, kind = sample_body(args.model, args.sample), JSON
    elif args.text is not None:
        body, kind = args.text.encode("utf-8"), "text/plain; charset=utf-8"
    elif not args.file.exists():
        parser.error(f"{args.file} does not exist")
    else:
        body, kind = args.file.read_bytes(), content_type(args.file)
    reply = predict(endpoints, args.model, body, kind, args.version)
    try:
        print(json.dumps(reply.json(), indent=2))
    except ValueError:
        print(reply.text)
    if reply.status_code != 200:
        reason = unavailable_reason(endpoints, args.model, reply, ServerConfig.read(args.config).job_queue_size)
        where = endpoints.prediction_url(args.model, args.version)
        print(f"error: HTTP {reply.status_code} from {where}" + (f": {reason}" if reason else ""), file=sys.stderr)
        return 1
    return 0


def add_lane_options(parser) -> None:
    """--model (a lane of a model in models/, default the first's stream lane) and --sample (which of its samples)."""
    lanes = [lane.name for lane in registry.lanes()]
    parser.add_argument("--model", default=lanes[0], help=f"lane: {', '.join(lanes)} (default %(default)s)")
    parser.add_argument("--sample", type=int, default=0, help="without FILE or --text: send this sample (default %(default)s)")


def sample_body(lane: str, index: int) -> bytes:
    """{"instances": [sample]}: the model's sample `index` (models/<name>/samples.json) for one of its lanes (its
    stream and bulk lanes, or another named <model>-..., such as a sequence lane)."""
    found = registry.model({lane.name: lane.model for lane in registry.lanes()}.get(lane) or lane.split("-")[0])
    instances = found.samples().instances
    if not 0 <= index < len(instances):
        raise ConfigError(f"{found.name} has samples 0..{len(instances) - 1} (models/{found.name}/samples.json), not {index}")
    return json.dumps({"instances": [instances[index]]}).encode()


if __name__ == "__main__":
    cli.run(lambda: main())
