"""config.properties for the image, rendered at build time from the repository's (which stays on loopback).

Inside a container the front door (nginx, scripts/server/front_door.py) takes all interfaces to be reachable
through published ports, the host deciding what is exposed (`-p 127.0.0.1:8080:8080`); TorchServe stays on
loopback behind it. Same ports as config.properties, absolute paths (the server starts in the key volume, not in
the repository), and the environment variables enabled that move the ports (TorchServe's TS_*, the front door's
FRONT_DOOR_*_ADDRESS: `make image-test` moves them, as it shares the host's network).

    python -m scripts.container.config            # writes config.container.properties (the Dockerfile does)
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from scripts import cli
from scripts.errors import ConfigError
from scripts.layout import CONFIG, ROOT
from scripts.server.config import FRONT_DOOR_KEY, ServerConfig
from scripts.server.front_door import front_door_addresses

CONTAINER_CONFIG = ROOT / "config.container.properties"
# The image's key volume (the Dockerfile's VOLUME): TorchServe runs there and writes key_file.json into it.
KEY_DIR = Path("/keys")
# Written next to key_file.json by the entry point once every lane has been warmed (scripts/container/warm.py);
# the readiness check (healthcheck --ready) passes only when it is there. Removed at each start.
WARMED_MARKER = "warmed-up.json"
ALL_INTERFACES = "0.0.0.0"
# TorchServe's defaults, for a config.properties that leaves an address or port out.
DEFAULT_ADDRESSES = {
    "inference": "http://127.0.0.1:8080",
    "management": "http://127.0.0.1:8081",
    "metrics": "http://127.0.0.1:8082",
}
DEFAULT_PORTS = {"grpc_inference": 7070, "grpc_management": 7071, "workers": 9000}
HEADER = (
    "# Rendered in the image by scripts/container/config.py from config.properties: all interfaces (inside the\n"
    "# container only), absolute paths, and TorchServe's TS_* environment variables on (docs/container.md).\n"
)


def ports_of(config: ServerConfig) -> dict[str, int]:
    """{listener: port} as ServerConfig.render takes them, from `config`'s addresses."""
    ports = {}
    for name, default in DEFAULT_ADDRESSES.items():
        address = config.get(f"{name}_address", default)
        port = urlsplit(address).port
        if port is None:
            raise ConfigError(f"{config.path}: {name}_address={address} has no port; write it as http://host:port")
        ports[name] = port
    ports["grpc_inference"] = int(config.get("grpc_inference_port", str(DEFAULT_PORTS["grpc_inference"])))
    ports["grpc_management"] = int(config.get("grpc_management_port", str(DEFAULT_PORTS["grpc_management"])))
    ports["workers"] = int(config.get("initial_worker_port", str(DEFAULT_PORTS["workers"])))
    return ports


def render_container_config(out: Path = CONTAINER_CONFIG, source: Path = CONFIG) -> Path:
    """TorchServe on loopback inside the container (its own ports), the front door on every interface (the
    published ports): only nginx is reachable from outside."""
    config = ServerConfig.read(source)
    ports = ports_of(config)
    door = front_door_addresses(config)
    if not door:
        raise ConfigError(f"{source} names no front door (front_door_*_address): the image serves clients through one")
    overrides = {
        **{f"{name}_address": f"http://127.0.0.1:{ports[name]}" for name in DEFAULT_ADDRESSES},
        "grpc_inference_address": "127.0.0.1",
        "grpc_management_address": "127.0.0.1",
        **{FRONT_DOOR_KEY.format(name): f"{ALL_INTERFACES}:{address.rpartition(':')[2]}" for name, address in door.items()},
        "enable_envvars_config": "true",
    }
    config.render(out, config.model_store, ports, overrides)
    out.write_text(HEADER + out.read_text())
    return out


def listener_environment(ports: dict[str, int], door: dict[str, int], host: str = "127.0.0.1") -> dict[str, str]:
    """The variables that put every listener of the image on `host`: TorchServe's TS_* on `ports` (free_ports()'s
    names), the front door's FRONT_DOOR_*_ADDRESS on `door` ({listener: port}): for a container sharing the host's
    network, which must not take 8080-8082/7070-7071."""
    return {
        "TS_INFERENCE_ADDRESS": f"http://{host}:{ports['inference']}",
        "TS_MANAGEMENT_ADDRESS": f"http://{host}:{ports['management']}",
        "TS_METRICS_ADDRESS": f"http://{host}:{ports['metrics']}",
        "TS_GRPC_INFERENCE_ADDRESS": host,
        "TS_GRPC_MANAGEMENT_ADDRESS": host,
        "TS_GRPC_INFERENCE_PORT": str(ports["grpc_inference"]),
        "TS_GRPC_MANAGEMENT_PORT": str(ports["grpc_management"]),
        "TS_INITIAL_WORKER_PORT": str(ports["workers"]),
        **{f"FRONT_DOOR_{name.upper()}_ADDRESS": f"{host}:{port}" for name, port in door.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--out", type=Path, default=CONTAINER_CONFIG, help="where to write it")
    parser.add_argument("--config", type=Path, default=CONFIG, help="the config.properties to start from")
    args = parser.parse_args(argv)
    print(f"wrote {render_container_config(args.out, args.config)}")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
