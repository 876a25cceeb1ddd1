"""Where a server is and how to talk to it: addresses from its config.properties, tokens from key_file.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from scripts.errors import ConfigError
from scripts.layout import CONFIG, KEY_FILE
from scripts.server.config import ServerConfig


@dataclass(frozen=True)
class Endpoints:
    inference: str
    management: str
    metrics: str
    grpc_host: str
    grpc_inference_port: int
    grpc_management_port: int
    key_file: Path

    @classmethod
    def from_config(cls, config: Path = CONFIG, key_file: Path = KEY_FILE) -> Endpoints:
        p = ServerConfig.read(config)
        return cls(
            inference=p.get("inference_address", "http://127.0.0.1:8080"),
            management=p.get("management_address", "http://127.0.0.1:8081"),
            metrics=p.get("metrics_address", "http://127.0.0.1:8082"),
            grpc_host=p.get("grpc_inference_address", "127.0.0.1"),
            grpc_inference_port=int(p.get("grpc_inference_port", "7070")),
            grpc_management_port=int(p.get("grpc_management_port", "7071")),
            key_file=key_file,
        )

    def token(self, kind: str) -> str:
        """The 'inference' or 'management' key TorchServe wrote at start-up."""
        return read_token(self.key_file, kind)

    def auth(self, kind: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(kind)}"}

    def prediction_url(self, model: str, version: str | None = None) -> str:
        return f"{self.inference}/predictions/{model}" + (f"/{version}" if version else "")


def read_token(key_file: Path, kind: str) -> str:
    try:
        stamp = key_file.stat()
    except FileNotFoundError:
        raise ConfigError(f"{key_file} not found: start the server with `make serve` (it writes the token file there)") from None
    try:
        keys = _read_keys(key_file, stamp.st_mtime_ns, stamp.st_size)
        return keys[kind]["key"]
    except (KeyError, TypeError, ValueError):
        raise ConfigError(
            f"{key_file} has no {kind!r} key (or is still being written); is it TorchServe's key_file.json?"
        ) from None


@lru_cache(maxsize=8)
def _read_keys(key_file: Path, mtime_ns: int, size: int) -> dict:
    """Parsed once per version of the file: clients ask for the token on every request, and a new
    server or a rotated key (a rewritten file) is still picked up."""
    return json.loads(key_file.read_text())
