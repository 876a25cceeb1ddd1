"""The image's HEALTHCHECK and the pod's probes: TorchServe's /ping answers 200 "Healthy" (and through the front door
too, where the config names one), and with `--ready`
every lane (every model the management API lists) has a worker in state READY and the entry point has warmed
every lane and found each answering its model's samples as samples.json says (its marker, warmed-up.json, stands
next to key_file.json and records both: scripts/container/warm.py).

TorchServe 0.12 puts /ping behind the inference token too, so this reads key_file.json from the key volume,
and renews a key that has expired through TorchServe's /token with the never-expiring API key
(scripts/server/endpoints.py), so a container outlives its keys' token_expiration_min. /ping alone does not
see a lane without workers: TorchServe 0.12 reports the state of the last model it looks at, so a lane with
none passes behind a healthy one; `--ready` asks each lane. The addresses are read the way TorchServe reads
them: TS_INFERENCE_ADDRESS / TS_MANAGEMENT_ADDRESS when the config enables environment variables, else the
config's. Exits 0 when healthy, 1 otherwise.

    python -m scripts.container.healthcheck [--ready] [--config config.container.properties] [--key-file /keys/key_file.json]
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import requests

from scripts import cli
from scripts.container.config import CONTAINER_CONFIG, DEFAULT_ADDRESSES, KEY_DIR, WARMED_MARKER
from scripts.errors import ServerError
from scripts.server.config import ServerConfig
from scripts.server.endpoints import Endpoints, token_refused
from scripts.server.front_door import front_door_addresses, local

TIMEOUT_S = 4.0


def address_of(config: ServerConfig, name: str, environ: Mapping[str, str] = os.environ) -> str:
    """`name` ("inference", "management") listener's address as TorchServe reads it."""
    address = config.get(f"{name}_address", DEFAULT_ADDRESSES[name])
    if config.get("enable_envvars_config", "false").lower() == "true":
        address = environ.get(f"TS_{name.upper()}_ADDRESS", address)
    return address


def inference_address(config: ServerConfig, environ: Mapping[str, str] = os.environ) -> str:
    return address_of(config, "inference", environ)


def local_url(address: str, path: str) -> str:
    """`path` on `address`, reached through loopback when the server listens on all interfaces."""
    parts = urlsplit(address)
    host = "127.0.0.1" if parts.hostname in (None, "0.0.0.0") else parts.hostname
    return urlunsplit((parts.scheme, f"{host}:{parts.port}", path, "", ""))


def ping_url(address: str) -> str:
    return local_url(address, "/ping")


def endpoints_for(config: Path, key_file: Path) -> Endpoints:
    """The container's endpoints on loopback, with its key file (renewing expired keys through /token)."""
    server = ServerConfig.read(config)
    base = Endpoints.from_config(config, key_file, direct=True)
    return Endpoints(
        inference=local_url(address_of(server, "inference"), ""),
        management=local_url(address_of(server, "management"), ""),
        metrics=base.metrics,
        grpc_host=base.grpc_host,
        grpc_inference_port=base.grpc_inference_port,
        grpc_management_port=base.grpc_management_port,
        key_file=key_file,
    )


def _get(endpoints: Endpoints, kind: str, url: str) -> requests.Response:
    def send(token: str) -> requests.Response:
        try:
            return requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT_S)
        except requests.RequestException as error:
            raise ServerError(f"{url}: no answer ({type(error).__name__})") from None

    return endpoints.with_token(kind, send, token_refused)


def check(config: Path, key_file: Path, ready: bool = False, warmed: bool = False) -> None:
    """Returns when /ping says Healthy (and, with `ready`, every lane has a READY worker; with `warmed` too, the
    lanes have been warmed); else ServerError (or ConfigError: no key_file.json yet)."""
    endpoints = endpoints_for(config, key_file)
    url = f"{endpoints.inference}/ping"
    reply = _get(endpoints, "inference", url)
    if reply.status_code != 200 or '"Healthy"' not in reply.text:
        raise ServerError(f"{url}: HTTP {reply.status_code} {' '.join(reply.text.split())[:200]}")
    door = front_door_addresses(ServerConfig.read(config), os.environ).get("inference")
    if door is not None:  # clients come in through the front door: it must answer too
        through = f"http://{local(door)}/ping"
        reply = _get(endpoints, "inference", through)
        if reply.status_code != 200 or '"Healthy"' not in reply.text:
            raise ServerError(f"the front door {through}: HTTP {reply.status_code} {' '.join(reply.text.split())[:200]}")
    if ready:
        check_lanes(endpoints)
    if warmed:
        check_warmed(key_file.with_name(WARMED_MARKER))


def check_warmed(path: Path) -> None:
    """ServerError until the entry point's marker is there, and while it says a lane failed its samples gate."""
    if not path.exists():
        raise ServerError(f"the lanes are not warmed up yet (no {path}; the entry point writes it)")
    try:
        failed = json.loads(path.read_text()).get("failed_gates") or []
    except (ValueError, AttributeError):
        raise ServerError(f"{path}: not the entry point's JSON record; remove it, the next warm-up writes it again") from None
    if failed:
        raise ServerError(f"a lane answers its model's samples otherwise than samples.json says ({path}): {'; '.join(failed)}")


def check_lanes(endpoints: Endpoints) -> None:
    """ServerError naming the lanes that have no worker in state READY (none registered: not ready either)."""
    listing = _get(endpoints, "management", f"{endpoints.management}/models?limit=1000")
    if listing.status_code != 200:
        raise ServerError(f"{endpoints.management}/models: HTTP {listing.status_code} {listing.text.strip()[:200]}")
    lanes = [entry["modelName"] for entry in listing.json().get("models", [])]
    if not lanes:
        raise ServerError("no lane is registered")
    idle = [lane for lane in lanes if not _ready_workers(endpoints, lane)]
    if idle:
        raise ServerError(f"lane(s) without a READY worker: {', '.join(idle)}")


def _ready_workers(endpoints: Endpoints, lane: str) -> int:
    reply = _get(endpoints, "management", f"{endpoints.management}/models/{lane}")
    if reply.status_code != 200:
        return 0
    return sum(worker.get("status") == "READY" for version in reply.json() for worker in version.get("workers", []))


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--config", type=Path, default=CONTAINER_CONFIG, help="the config.properties TorchServe runs with")
    parser.add_argument("--key-file", type=Path, default=KEY_DIR / "key_file.json", help="TorchServe's key_file.json")
    parser.add_argument("--ready", action="store_true", help="also every lane has a READY worker and was warmed (readiness)")
    args = parser.parse_args(argv)
    check(args.config, args.key_file, args.ready, warmed=args.ready)
    print("Healthy")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(), prefix="unhealthy")
