"""The image's HEALTHCHECK: TorchServe's /ping answers 200 "Healthy" (every lane has its minimum workers).

TorchServe 0.12 puts /ping behind the inference token too, so this reads key_file.json from the key
volume. The inference address is read the way TorchServe reads it: TS_INFERENCE_ADDRESS when the config
enables environment variables, else inference_address. Exits 0 when healthy, 1 otherwise.

    python -m scripts.container.healthcheck [--config config.container.properties] [--key-file /keys/key_file.json]
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import requests

from scripts import cli
from scripts.container.config import CONTAINER_CONFIG, DEFAULT_ADDRESSES, KEY_DIR
from scripts.errors import ServerError
from scripts.server.config import ServerConfig
from scripts.server.endpoints import read_key

TIMEOUT_S = 4.0


def inference_address(config: ServerConfig, environ: Mapping[str, str] = os.environ) -> str:
    address = config.get("inference_address", DEFAULT_ADDRESSES["inference"])
    if config.get("enable_envvars_config", "false").lower() == "true":
        address = environ.get("TS_INFERENCE_ADDRESS", address)
    return address


def ping_url(address: str) -> str:
    """/ping on `address`, reached through loopback when the server listens on all interfaces."""
    parts = urlsplit(address)
    host = "127.0.0.1" if parts.hostname in (None, "0.0.0.0") else parts.hostname
    return urlunsplit((parts.scheme, f"{host}:{parts.port}", "/ping", "", ""))


def check(config: Path, key_file: Path) -> None:
    """Returns when /ping says Healthy; else ServerError (or ConfigError: no key_file.json yet)."""
    url = ping_url(inference_address(ServerConfig.read(config)))
    headers = {"Authorization": f"Bearer {read_key(key_file, 'inference').value}"}
    try:
        reply = requests.get(url, headers=headers, timeout=TIMEOUT_S)
    except requests.RequestException as error:
        raise ServerError(f"{url}: no answer ({type(error).__name__})") from None
    if reply.status_code != 200 or '"Healthy"' not in reply.text:
        raise ServerError(f"{url}: HTTP {reply.status_code} {' '.join(reply.text.split())[:200]}")


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--config", type=Path, default=CONTAINER_CONFIG, help="the config.properties TorchServe runs with")
    parser.add_argument("--key-file", type=Path, default=KEY_DIR / "key_file.json", help="TorchServe's key_file.json")
    args = parser.parse_args(argv)
    check(args.config, args.key_file)
    print("Healthy")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(), prefix="unhealthy")
