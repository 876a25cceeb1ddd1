"""Where a server is and how to talk to it: addresses from its config.properties, tokens from key_file.json.

    python -m scripts.server.endpoints rotate inference     # new inference key (management, both)

Keys expire (config.properties' token_expiration_min) and may be rotated at any time through the
management API's /token endpoint, which rewrites key_file.json. Every client here survives both: a key
the file says has expired is renewed before it is sent, and a request refused for its token is sent
once more with the key the file holds then (see Endpoints.with_token).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

import requests

from scripts import cli
from scripts.errors import ConfigError
from scripts.layout import CONFIG, KEY_FILE
from scripts.server.config import FRONT_DOOR_KEY, FRONT_DOOR_LISTENERS, ServerConfig

KINDS = ("inference", "management")
# The key of /token itself: TorchServe's "API" entry, which never expires.
TOKEN_API = "API"
# A key this close to its end is renewed before use: a request sent with it might arrive after it.
RENEW_MARGIN = timedelta(seconds=1)
# What TorchServe 0.12 answers a missing, wrong or expired token with (REST: 400 with this type;
# gRPC: PERMISSION_DENIED with the message).
INVALID_KEY = "InvalidKeyException"
REFUSED_MESSAGE = "Token Authorization failed"
# One renewal at a time in this process: threads that found the same key expired share one new key.
_RENEWING = threading.Lock()
PARSE_ATTEMPTS, PARSE_PAUSE = 5, 0.05

Result = TypeVar("Result")


@dataclass(frozen=True)
class Key:
    """One entry of key_file.json: the key and when TorchServe stops accepting it (None: never)."""

    value: str
    expires: datetime | None

    def expired(self, margin: timedelta = RENEW_MARGIN) -> bool:
        return self.expires is not None and datetime.now(UTC) + margin >= self.expires


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
    def from_config(cls, config: Path = CONFIG, key_file: Path = KEY_FILE, direct: bool = False) -> Endpoints:
        """Where clients connect: the front door's listeners where config.properties names them (front_door_*),
        else TorchServe's own; `direct`: TorchServe's own always (its readiness, before the front door is up)."""
        p = ServerConfig.read(config)
        door = {} if direct else {name: p.properties.get(FRONT_DOOR_KEY.format(name)) for name in FRONT_DOOR_LISTENERS}
        if door.get("inference"):
            hosts = {name: _host_port(value) for name, value in door.items() if value}
            grpc_host, grpc_inference_port = hosts["grpc_inference"]
            return cls(
                inference=f"http://{':'.join(map(str, hosts['inference']))}",
                management=f"http://{':'.join(map(str, hosts['management']))}",
                metrics=f"http://{':'.join(map(str, hosts['metrics']))}",
                grpc_host=grpc_host,
                grpc_inference_port=grpc_inference_port,
                grpc_management_port=hosts["grpc_management"][1],
                key_file=key_file,
            )
        return cls(
            inference=p.get("inference_address", "http://127.0.0.1:8080"),
            management=p.get("management_address", "http://127.0.0.1:8081"),
            metrics=p.get("metrics_address", "http://127.0.0.1:8082"),
            grpc_host=p.get("grpc_inference_address", "127.0.0.1"),
            grpc_inference_port=int(p.get("grpc_inference_port", "7070")),
            grpc_management_port=int(p.get("grpc_management_port", "7071")),
            key_file=key_file,
        )

    def token(self, kind: str, lasting_s: float = 0.0) -> str:
        """The 'inference' or 'management' key TorchServe wrote, renewed first if the file says it expired, or
        expires within `lasting_s` (a load generator that cannot renew a key, wrk, needs one that outlives its run)."""
        key, margin = read_key(self.key_file, kind), RENEW_MARGIN + timedelta(seconds=lasting_s)
        if key.expired(margin):
            return self.renew(kind, key.value, margin) or key.value
        return key.value

    def auth(self, kind: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(kind)}"}

    def prediction_url(self, model: str, version: str | None = None) -> str:
        return f"{self.inference}/predictions/{model}" + (f"/{version}" if version else "")

    def with_token(self, kind: str, send: Callable[[str], Result], refused: Callable[[Result], bool]) -> Result:
        """`send(token)`, and once more with a fresh token if TorchServe refused the first (`refused`).

        The one retry covers a key rotated or expired between reading it and its arrival; a key that
        is refused while it is still the file's and not expired is wrong, and its refusal comes back.
        """
        token = self.token(kind)
        result = send(token)
        if refused(result):
            fresh = self.renew(kind, token)
            if fresh is not None:
                result = send(fresh)
        return result

    def renew(self, kind: str, failed: str, margin: timedelta = RENEW_MARGIN) -> str | None:
        """A key to use instead of `failed`: the file's if it changed since (someone rotated it), else a
        new one from TorchServe's /token when `failed` has expired (or expires within `margin`); None when
        `failed` is the file's current, unexpired key (retrying with it would be refused again)."""
        with _RENEWING:
            key = read_key(self.key_file, kind, fresh=True)
            if key.value != failed:
                return key.value
            if not key.expired(margin):
                return None
            return self.rotate(kind)

    def rotate(self, kind: str) -> str:
        """Ask TorchServe for a new `kind` key (the old one stops working at once); returns the new key."""
        if kind not in KINDS:
            raise ConfigError(f"no key kind {kind!r}: TorchServe rotates {' or '.join(KINDS)} keys")
        api = read_key(self.key_file, TOKEN_API, fresh=True)
        url = f"{self.management}/token"
        try:
            reply = requests.get(url, params={"type": kind}, headers={"Authorization": f"Bearer {api.value}"}, timeout=30)
        except requests.ConnectionError:
            raise ConfigError(f"cannot renew the {kind} key: no TorchServe management API at {self.management}") from None
        if reply.status_code != 200:
            raise ConfigError(
                f"TorchServe refused to renew the {kind} key with the API key from {self.key_file} "
                f"(HTTP {reply.status_code}: {reply.text.strip()[:200]}); is it this server's key file?"
            )
        # TorchServe rewrote the file before answering.
        return read_key(self.key_file, kind, fresh=True).value


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    return host, int(port)


def token_refused(reply: requests.Response) -> bool:
    """Whether a REST answer is TorchServe's refusal of the token (a 400, not a 401, in 0.12)."""
    if reply.status_code != 400:
        return False
    try:
        body = reply.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("type") == INVALID_KEY


def predict(
    endpoints: Endpoints,
    model: str,
    body: bytes,
    kind: str,
    version: str | None = None,
    timeout: float = 300,
    session: requests.Session | None = None,
    headers: dict[str, str] | None = None,
) -> requests.Response:
    """One POST to /predictions/<model>[/<version>] with the inference token and a real content type
    (without one, curl-style form encoding makes TorchServe mangle binary bodies). Pass a `session` to
    keep the connection open across many calls (batch jobs); `headers` are sent as well. A token TorchServe refused because it
    expired or was rotated meanwhile is replaced and the request sent once more (Endpoints.with_token)."""
    url = endpoints.prediction_url(model, version)

    def send(token: str) -> requests.Response:
        sent = {**(headers or {}), "Authorization": f"Bearer {token}", "Content-Type": kind}
        return (session or requests).post(url, data=body, headers=sent, timeout=timeout)

    return endpoints.with_token("inference", send, token_refused)


def read_key(key_file: Path, kind: str, fresh: bool = False) -> Key:
    """The `kind` entry ('inference', 'management' or 'API') of TorchServe's key_file.json.

    `fresh` reads the file again even if its time stamp and size did not change (a key rotated twice
    within the file system's clock tick leaves both alike)."""
    for _ in range(PARSE_ATTEMPTS):
        try:
            stamp = key_file.stat()
        except FileNotFoundError:
            raise ConfigError(
                f"{key_file} not found: start the server with `make serve` (it writes the token file there)"
            ) from None
        try:
            keys = json.loads(key_file.read_text()) if fresh else _read_keys(key_file, stamp.st_mtime_ns, stamp.st_size)
        except ValueError:
            # TorchServe rewrites the file in place (truncate, then write): caught in between, read again.
            time.sleep(PARSE_PAUSE)
            continue
        try:
            entry = keys[kind]
            return Key(entry["key"], _instant(entry.get("expiration time")))
        except (KeyError, TypeError, ValueError):
            break
    raise ConfigError(f"{key_file} has no {kind!r} key (or is still being written); is it TorchServe's key_file.json?")


@lru_cache(maxsize=8)
def _read_keys(key_file: Path, mtime_ns: int, size: int) -> dict:
    """Parsed once per version of the file: clients ask for the token on every request, and a new
    server or a rotated key (a rewritten file) is still picked up."""
    return json.loads(key_file.read_text())


def _instant(text: str | None) -> datetime | None:
    """Java's Instant.toString() (2026-12-01T09:39:42.608752421Z): nanoseconds cut to what datetime holds."""
    if text is None:
        return None
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00"))


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("action", choices=["rotate"])
    parser.add_argument("kind", choices=[*KINDS, "both"], help="which key to replace")
    cli.add_server_options(parser)
    args = parser.parse_args(argv)
    endpoints = Endpoints.from_config(args.config, args.key_file)
    for kind in KINDS if args.kind == "both" else [args.kind]:
        endpoints.rotate(kind)
        expires = read_key(endpoints.key_file, kind).expires
        until = f"valid until {expires:%Y-%m-%d %H:%M:%S} UTC" if expires else "no expiry"
        print(f"new {kind} key in {endpoints.key_file} ({until})")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
