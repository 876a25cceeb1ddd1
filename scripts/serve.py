"""`make serve` / `make stop`: run TorchServe from the repository root with config.properties.

    python -m scripts.serve start | stop
"""
from __future__ import annotations

import argparse
import time

from scripts.endpoints import CONFIG, ROOT, read_properties
from scripts.ts_server import Server


def loaded_lanes(config=CONFIG) -> dict[str, str]:
    """{lane: archive file} that config.properties loads at start-up (load_models=name=file.mar,...)."""
    entries = (entry.partition("=") for entry in read_properties(config).get("load_models", "").split(",") if entry)
    return {lane: archive for lane, _, archive in entries}


def lanes(config=CONFIG) -> list[str]:
    """Model names that config.properties loads at start-up."""
    return list(loaded_lanes(config))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop"])
    args = parser.parse_args()
    server = Server(config=CONFIG, workdir=ROOT, model_store=ROOT / "model_store")
    if args.action == "stop":
        server.stop()
        return
    started = time.monotonic()
    server.start()
    models = lanes()
    server.wait_ready(models)
    e = server.endpoints
    print(f"TorchServe is up in {time.monotonic() - started:.0f}s with lanes: {', '.join(models)}")
    print(f"  inference   {e.inference}/predictions/<lane>")
    print(f"  management  {e.management}/models")
    print(f"  metrics     {e.metrics}/metrics")
    print(f"  gRPC        {e.grpc_host}:{e.grpc_inference_port} (inference), :{e.grpc_management_port} (management)")
    print(f"  tokens      {e.key_file} (inference.key for predictions, management.key for the management API)")
    print(f"  logs        {ROOT / 'logs'}; stop with `make stop`")


if __name__ == "__main__":
    main()
