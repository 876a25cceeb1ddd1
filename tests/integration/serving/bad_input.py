"""What the REST and gRPC bad-input tables share: which server a lane is on, which workers serve it, and the
body one byte over the server's max_request_size."""

from __future__ import annotations

from scripts.server.config import ServerConfig
from scripts.swap.management import ManagementApi

OVER_MAX_REQUEST_SIZE = b"over max_request_size"  # stands for a body one byte over the server's limit


def model_of(lane: str) -> str:
    return "minilm" if lane.startswith("minilm") else "digits"


def server_and_watched_lane(servers: dict, lane: str) -> tuple:
    """The server of `lane`'s model, and the lane whose workers must outlive the case (digits for an unknown model)."""
    return servers[model_of(lane)], lane if lane != "nope" else "digits"


def worker_pids(endpoints, lane: str) -> tuple[int, ...]:
    return ManagementApi(endpoints).worker_pids(lane)


def sent_body(server, body: bytes) -> bytes:
    """`body` as sent to `server`: OVER_MAX_REQUEST_SIZE becomes that many bytes and one more."""
    if body != OVER_MAX_REQUEST_SIZE:
        return body
    return b"\x00" * (ServerConfig.read(server.server.config).max_request_size + 1)
