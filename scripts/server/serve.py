"""`make serve` / `make stop`: run TorchServe from the repository root with config.properties.

python -m scripts.server.serve start | stop

Before starting, every archive config.properties loads (load_models) must match the sha256 that
`make archive` recorded next to it (scripts/archive/reader.py); otherwise nothing starts.
"""

from __future__ import annotations

import time
from pathlib import Path

from scripts import cli
from scripts.archive.reader import MarFile
from scripts.layout import BUILD, CONFIG, MODEL_STORE, ROOT
from scripts.server.config import ServerConfig
from scripts.server.front_door import FrontDoor
from scripts.server.process import Server
from scripts.server.warmup import warm_up

FRONT_DOOR = BUILD / "front-door"


def verify_loaded_archives(config: ServerConfig, model_store: Path) -> list[str]:
    """The archives `config` loads at start-up, each checked against its recorded sha256 (DigestMismatch)."""
    archives = sorted(set(config.loaded_lanes().values()))
    for name in archives:
        MarFile(model_store / name).verify_digest()
    return archives


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("action", choices=["start", "stop"])
    args = parser.parse_args()
    server = Server(config=CONFIG, workdir=ROOT, model_store=MODEL_STORE)
    door = FrontDoor(CONFIG, FRONT_DOOR)
    if args.action == "stop":
        door.stop()
        server.stop()
        return 0
    config = ServerConfig.read(CONFIG)
    verify_loaded_archives(config, MODEL_STORE)
    started = time.monotonic()
    server.start()
    models = config.lanes()
    server.wait_ready(models)
    door.start(daemon=True)
    e = server.endpoints
    # Ready means warm: a fresh JVM serves its first thousands of requests at a fraction of its warm rate.
    warmed = warm_up(e, models)
    failed = sum(w.failed for w in warmed)
    print(
        f"warmed up with {sum(w.requests for w in warmed):,} requests in {sum(w.seconds for w in warmed):.0f}s"
        + (f" ({failed} failed: see logs/model_log.log)" if failed else "")
    )
    where = {
        "inference": f"{e.inference}/predictions/<lane>",
        "management": f"{e.management}/models",
        "metrics": f"{e.metrics}/metrics",
        "gRPC": f"{e.grpc_host}:{e.grpc_inference_port} (inference), :{e.grpc_management_port} (management)",
        "tokens": f"{e.key_file} (inference.key for predictions, management.key for the management API)",
        "logs": f"{ROOT / 'logs'}, {FRONT_DOOR / 'nginx.out'} (the front door); stop with `make stop`",
    }
    took = time.monotonic() - started
    print(f"TorchServe is up behind its front door (nginx, docs/front-door.md) in {took:.0f}s with lanes: {', '.join(models)}")
    print("\n".join(f"  {name:<12}{address}" for name, address in where.items()))
    return 0


if __name__ == "__main__":
    cli.run(main)
