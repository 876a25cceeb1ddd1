"""The front door: nginx before TorchServe, passing only what a lane can bear (docs/front-door.md).

    python -m scripts.server.front_door render [--out build/front-door/nginx.conf]   # what `make serve` runs

TorchServe 0.12.0's frontend runs netty 4.1.53 (2020): it decodes form and multipart bodies into objects
before any handler sees them (a 32 MiB form body ends its JVM) and holds half-sent requests forever. Clients
therefore reach TorchServe only through nginx, which:

- routes /predictions/<lane> for the lanes config.properties loads (and /ping), nothing else of the
  inference API; each lane with its own byte limit (the archive's handler.max_request_bytes, else
  max_request_size), and only the content types of the payload contract (a form: 415, naming them);
- reads each request whole (header and body timeouts, bounded header and URL sizes, malformed framing
  refused with a 400) and sends TorchServe a request of its own, framed by Content-Length, over a few
  kept-alive connections;
- bounds requests in flight per client and per listener, and the bulk lanes' to what the pod's memory is
  sized for (scripts/deploy/memory.py);
- fronts the management API (no forms, small bodies), the metrics (GET /metrics) and gRPC (HTTP/2 to
  clients, with the largest lane's byte limit: one gRPC route carries every lane).

One renderer for every mode: `make serve` and the image pass the client's TorchServe token through; the pod's
gateway (deploy/k8s/gateway/nginx.conf, rendered by `python -m scripts.deploy.render k8s`) swaps its shared
client token for the pod's own key with njs.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

from handlers.settings import HandlerSettings
from handlers.tasks import TASKS
from scripts import cli
from scripts.archive.reader import MarFile
from scripts.errors import ConfigError, ServerError
from scripts.layout import BUILD, ROOT
from scripts.server.config import BULK_SUFFIX, FRONT_DOOR_KEY, FRONT_DOOR_LISTENERS, ServerConfig
from scripts.server.process import stop_process_group

INSTALL_NGINX = (
    "install nginx: `apt-get install -y nginx-light` (Debian/Ubuntu; the pod's gateway also needs libnginx-mod-http-js)"
)
# A batch job sends this many chunks at once (scripts/jobs/batch_job.py JobConfig.concurrency).
BULK_CLIENT_CHUNKS = 4
# What every lane reads (README "Payload contract"): JSON (with any +json subtype) and numpy's .npy; each task adds
# the raw bodies it reads (Task.raw_media). No Content-Type at all is a raw body too.
COMMON_TYPES = ("application/json", "application/*+json", "application/x-npy")
# Slow clients: a request's header must arrive within this, and its body must not pause longer between reads.
HEADER_TIMEOUT_S = 10
BODY_TIMEOUT_S = 10
# Bounds on a request's head: the request line and each header line, and how many such buffers one request may use.
HEADER_BUFFER_BYTES = 16 * 1024
HEADER_BUFFERS = 4
# Requests in flight: from one client address, and on one listener in all (TorchServe queues 100 a lane).
PER_CLIENT_REQUESTS = 256
PER_LISTENER_REQUESTS = 1024
# Open connections nginx holds (idle and half-sent ones included; each costs it about two kilobytes): per worker
# process, each with descriptors of its own, the listeners shared among them by the kernel (reuseport).
WORKERS = 4
WORKER_CONNECTIONS = 16384
NOFILE = 2 * WORKER_CONNECTIONS
# Kept-alive connections to each TorchServe listener.
UPSTREAM_KEEPALIVE = 64
# As long as TorchServe may take to answer: the archives' responseTimeout, a wall-clock backstop of 7,200 s (models/*/
# model-config.yaml; each lane's own, shorter limit is handler.response_timeout_s, on a bulk lane in seconds its worker
# ran), and a margin. A stream lane answers within its own limit long before.
UPSTREAM_TIMEOUT_S = 7210
MANAGEMENT_BODY_BYTES = 64 * 1024
# Internal locations of the front door's own error answers (never reachable from outside: `internal`).
ERROR_PATH = "/__front_door/error"
UNAUTHORIZED = "send the client token as Authorization: Bearer <token> (docs/kubernetes.md)"
GRPC_SERVICES = {
    "grpc_inference": "org.pytorch.serve.grpc.inference.InferenceAPIsService",
    "grpc_management": "org.pytorch.serve.grpc.management.ManagementAPIsService",
}


@dataclass(frozen=True)
class LaneRule:
    lane: str
    body_bytes: int  # the most one request's body may have
    admitted: int | None  # requests let onto the lane at once (bulk lanes), None: TorchServe's queue bounds it
    media: tuple[str, ...] = ()  # what its task reads as a raw body (Task.raw_media)


def bulk_admitted(config: ServerConfig, lane: str) -> int:
    """Requests let onto a bulk lane at once: its workers' batches and every chunk of one batch job."""
    settings = config.lane_settings(lane.removesuffix(BULK_SUFFIX))[lane]
    return settings.workers * settings.batch_size + BULK_CLIENT_CHUNKS


def archive_yaml(archive: str, config: ServerConfig | None = None) -> dict:
    """The model-config.yaml a lane of `config` runs with: the archive's own where the model store holds it (the
    image carries no models/ folder), else the one it is built from (models/<archive stem>/)."""
    built = config.model_store / archive if config is not None else None
    if built is not None and built.is_file():
        return MarFile(built).model_config()
    return yaml.safe_load((ROOT / "models" / Path(archive).stem / "model-config.yaml").read_text())


def lane_body_bytes(config: ServerConfig, lane: str, archive: str) -> int:
    return HandlerSettings.from_yaml(archive_yaml(archive, config), lane).bytes_for(lane) or config.max_request_size


def lane_media(config: ServerConfig, lane: str, archive: str) -> tuple[str, ...]:
    """The raw bodies the lane's task reads (its Task.raw_media, e.g. "image/", "application/octet-stream")."""
    settings = HandlerSettings.from_yaml(archive_yaml(archive, config), lane)
    task = TASKS.get(settings.task)
    if task is None:
        raise ConfigError(f"{archive}: unknown handler.task {settings.task!r}; known tasks: {', '.join(sorted(TASKS))}")
    return tuple(task.raw_media)


def lane_rules(config: ServerConfig) -> list[LaneRule]:
    return [
        LaneRule(
            lane,
            lane_body_bytes(config, lane, archive),
            bulk_admitted(config, lane) if lane.endswith(BULK_SUFFIX) else None,
            lane_media(config, lane, archive),
        )
        for lane, archive in config.loaded_lanes().items()
    ]


def _environment(config: ServerConfig, environ: Mapping[str, str] | None) -> Mapping[str, str]:
    """The variables that move listeners, where the config lets them (enable_envvars_config=true, the image's)."""
    if environ is None or config.get("enable_envvars_config", "false").lower() != "true":
        return {}
    return environ


def front_door_addresses(config: ServerConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """{listener: host:port} clients connect to (config.properties' front_door_*_address, which
    FRONT_DOOR_<LISTENER>_ADDRESS in `environ` replaces where the config enables variables); {} for none."""
    moved = _environment(config, environ)
    found = {}
    for name in FRONT_DOOR_LISTENERS:
        value = moved.get(f"FRONT_DOOR_{name.upper()}_ADDRESS") or config.properties.get(FRONT_DOOR_KEY.format(name))
        if value:
            found[name] = value.split("://", 1)[-1]
    return found


def torchserve_addresses(config: ServerConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """{listener: host:port} of TorchServe's own listeners, as TorchServe reads them (TS_* variables included)."""
    moved = _environment(config, environ)

    def setting(key: str, default: str) -> str:
        return moved.get(f"TS_{key.upper()}") or config.get(key, default)

    grpc_host = setting("grpc_inference_address", "127.0.0.1")
    return {
        "inference": setting("inference_address", "http://127.0.0.1:8080").split("://", 1)[-1],
        "management": setting("management_address", "http://127.0.0.1:8081").split("://", 1)[-1],
        "metrics": setting("metrics_address", "http://127.0.0.1:8082").split("://", 1)[-1],
        "grpc_inference": f"{grpc_host}:{setting('grpc_inference_port', '7070')}",
        "grpc_management": f"{setting('grpc_management_address', grpc_host)}:{setting('grpc_management_port', '7071')}",
    }


def _json(code: int, kind: str, message: str) -> str:
    text = message.replace("'", "’").replace('"', "'")
    return f'\'{{"code": {code}, "type": "{kind}", "message": "{text}"}}\''


def accepted_types(media: tuple[str, ...]) -> tuple[str, ...]:
    """The Content-Types a lane whose task reads `media` (prefixes such as "image/") takes, as a person reads them."""
    return COMMON_TYPES + tuple(f"{prefix}*" if prefix.endswith("/") else prefix for prefix in media)


def _pattern(accepted: str) -> str:
    """A PCRE for one accepted type, parameters (`; charset=...`) allowed after it."""
    token = r"[a-z0-9.+-]+"
    if accepted == "application/*+json":
        body = rf"application/{token}\+json"
    elif accepted.endswith("/*"):
        body = re.escape(accepted[:-1]) + token
    else:
        body = re.escape(accepted)
    return rf"~*^{body}\s*(;.*)?$"


def _content_type_map(variable: str, media: tuple[str, ...]) -> str:
    lines = [f"    map $content_type ${variable} {{", "        default 1;", '        "" 0;']
    lines += [f'        "{_pattern(accepted)}" 0;' for accepted in accepted_types(media)]
    return "\n".join([*lines, "    }"])


def _refused_variable(media: tuple[str, ...]) -> str:
    return "refused_type_" + (re.sub(r"[^a-z0-9]+", "_", "_".join(media)).strip("_") or "none")


@dataclass(frozen=True)
class Gateway:
    """The pod's mode: clients send a shared token, TorchServe gets its own key (njs, deploy/k8s/gateway/gateway.js)."""

    modules: str = "/usr/lib/nginx/modules"
    listen: str = "8000"
    upstream: str = "127.0.0.1:8080"


def render(
    config: ServerConfig,
    listen: dict[str, str],
    upstream: dict[str, str],
    gateway: Gateway | None = None,
    nofile: int = NOFILE,
) -> str:
    """nginx.conf for `listen` ({listener: host:port}, those to serve) before TorchServe at `upstream`."""
    rules = lane_rules(config)
    lanes = ", ".join(rule.lane for rule in rules)
    type_maps = "\n".join(_content_type_map(_refused_variable(media), media) for media in sorted({r.media for r in rules}))
    head = [
        "# Generated by scripts/server/front_door.py from config.properties and models/*/model-config.yaml: edit those,",
        "# not this file (docs/front-door.md).",
    ]
    if gateway:
        head += [f"load_module {gateway.modules}/ngx_http_js_module.so;"]
    head += [
        f"worker_processes {WORKERS};",
        f"worker_rlimit_nofile {nofile};",
        "pid nginx.pid;",
        "error_log stderr warn;",
    ]
    if gateway:
        head += ["env CLIENT_TOKEN;", "env TORCHSERVE_KEY_FILE;"]
    http = f"""
events {{
    worker_connections {min(WORKER_CONNECTIONS, nofile - 256)};
    multi_accept on;
}}

http {{
    access_log off;
    server_tokens off;
    default_type application/json;
    client_body_temp_path client_body;
    proxy_temp_path proxy;
    fastcgi_temp_path fastcgi;
    uwsgi_temp_path uwsgi;
    scgi_temp_path scgi;

    # Slow or half-sent requests are dropped, not held: the head within {HEADER_TIMEOUT_S} s, a body's reads
    # at most {BODY_TIMEOUT_S} s apart.
    client_header_timeout {HEADER_TIMEOUT_S}s;
    client_body_timeout {BODY_TIMEOUT_S}s;
    send_timeout 30s;
    keepalive_timeout 60s;
    keepalive_requests 100000;
    reset_timedout_connection on;
    client_header_buffer_size 1k;
    large_client_header_buffers {HEADER_BUFFERS} {HEADER_BUFFER_BYTES // 1024}k;
    client_body_buffer_size 1m;
    ignore_invalid_headers on;
    underscores_in_headers off;

    # Requests in flight: per client address and per listener; over either, 429.
    limit_conn_zone $binary_remote_addr zone=per_client:10m;
    limit_conn_zone $server_port zone=per_listener:1m;
    limit_conn_status 429;
    limit_conn_log_level warn;
    # Requests at once per bulk lane (scripts/deploy/memory.py sizes the pod's memory from it); over it, 503,
    # which batch jobs retry.
    map $uri $bulk_lane {{
        ~^/predictions/(?<lane>[\\w-]+-bulk)(/[^/]*)?$ $lane;
        default "";
    }}
    limit_conn_zone $bulk_lane zone=bulk:1m;

    # 1 for a Content-Type a lane does not read (forms and multipart above all: netty would decode them).
{type_maps}
    map $content_type $form_body {{
        default 0;
        "~*^application/x-www-form-urlencoded" 1;
        "~*^multipart/" 1;
    }}

    # Towards TorchServe: HTTP/1.1 re-encoded from what nginx parsed, the body whole and framed by Content-Length.
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_request_buffering on;
    proxy_read_timeout {UPSTREAM_TIMEOUT_S}s;
    proxy_send_timeout {UPSTREAM_TIMEOUT_S}s;
    grpc_read_timeout {UPSTREAM_TIMEOUT_S}s;
    grpc_send_timeout {UPSTREAM_TIMEOUT_S}s;
"""
    if gateway:
        http += """
    js_import gateway.js;
    js_set $client_allowed gateway.clientAllowed;
    js_set $torchserve_authorization gateway.torchserveAuthorization;
"""
    served = dict(listen)
    if gateway:
        served = {"inference": gateway.listen}
        upstream = {"inference": gateway.upstream}
    for name in served:
        http += f"""
    upstream {_upstream_name(name, gateway)} {{
        server {upstream[name]};
        keepalive {UPSTREAM_KEEPALIVE};
    }}
"""
    errors = _error_pages(lanes)
    for name, address in served.items():
        if name == "inference":
            http += _inference_server(address, rules, lanes, errors, gateway)
        elif name == "management":
            http += _management_server(address, errors)
        elif name == "metrics":
            http += _metrics_server(address, errors)
        else:
            http += _grpc_server(name, address, max(rule.body_bytes for rule in rules))
    return "\n".join(head) + "\n" + http + "}\n"


def _upstream_name(name: str, gateway: Gateway | None) -> str:
    return "torchserve" if gateway else f"torchserve_{name}"


@dataclass(frozen=True)
class ErrorPages:
    """The front door's own answers as JSON: `directives` in a server (and restated in any location that sets an
    error_page of its own, which replaces the server's), `locations` once per server."""

    directives: str
    locations: str

    def with_413(self, uri: str) -> str:
        return self.directives.replace(f"error_page 413 {ERROR_PATH}/413;", f"error_page 413 {uri};")


def _error_pages(lanes: str) -> ErrorPages:
    pages = {
        400: ("BadRequest", "malformed HTTP request (framing, header or URL): the front door passes only well-formed HTTP/1.1"),
        404: ("NotFound", f"no such route: this API serves /ping and /predictions/<lane> for lanes {lanes}"),
        408: (
            "RequestTimeout",
            f"the request did not arrive in time ({HEADER_TIMEOUT_S} s for its head, {BODY_TIMEOUT_S} s between body reads)",
        ),
        413: ("PayloadTooLarge", "request body over the limit of this route"),
        414: ("URITooLong", f"request line over {HEADER_BUFFER_BYTES} bytes"),
        429: ("TooManyRequests", f"too many requests in flight (at most {PER_CLIENT_REQUESTS} per client): retry later"),
        501: ("BadRequest", "a Transfer-Encoding other than chunked: send the body with Content-Length or chunked"),
        502: ("BadGateway", "TorchServe did not answer: it may be starting or stopped (see its logs)"),
        503: ("ServiceUnavailable", "this lane has as many requests at once as it takes: retry later"),
        504: ("GatewayTimeout", f"TorchServe did not answer within {UPSTREAM_TIMEOUT_S} s"),
        494: (
            "RequestHeaderTooLarge",
            f"a header over {HEADER_BUFFER_BYTES} bytes, or all over {HEADER_BUFFERS * HEADER_BUFFER_BYTES}",
        ),
    }
    directives, locations = [], []
    for code, (kind, message) in pages.items():
        status = 400 if code in (494, 501) else code
        directives.append(f"        error_page {code} {'' if status == code else f'={status} '}{ERROR_PATH}/{code};")
        locations.append(
            f"        location = {ERROR_PATH}/{code} {{ internal; return {status} {_json(status, kind, message)}; }}"
        )
    return ErrorPages("\n".join(directives), "\n".join(locations))


def _inference_server(address: str, rules: list[LaneRule], lanes: str, errors: ErrorPages, gateway: Gateway | None) -> str:
    upstream = _upstream_name("inference", gateway)
    guard = ""
    if gateway:
        guard = (
            '            if ($client_allowed != "1") {\n'
            f"                return 401 {_json(401, 'Unauthorized', UNAUTHORIZED)};\n"
            "            }\n"
        )
    text = f"""
    server {{
        listen {address} reuseport;
        limit_conn per_client {PER_CLIENT_REQUESTS};
        limit_conn per_listener {PER_LISTENER_REQUESTS};
{errors.directives}
{errors.locations}
"""
    if gateway:
        text += """
        # The gateway's own liveness; TorchServe's health is the torchserve container's probes.
        location = /healthz {
            return 200 '{"status": "ok"}';
        }

        proxy_set_header Authorization $torchserve_authorization;
        # Clients outside the pod are not told a worker's process id (handlers/headers.py): their ask is dropped,
        # and the answer's header hidden whatever asked for it.
        proxy_set_header X-Report-Worker-Pid "";
        proxy_hide_header X-Worker-Pid;
"""
    text += f"""
        location = /ping {{
{guard}            proxy_pass http://{upstream};
        }}
"""
    for rule in rules:
        # A location's own limit_conn replaces the server's: the bulk lanes restate the per-client and per-listener bounds.
        bulk = (
            f"            limit_conn bulk {rule.admitted};\n            limit_conn per_client {PER_CLIENT_REQUESTS};\n"
            f"            limit_conn per_listener {PER_LISTENER_REQUESTS};\n            limit_conn_status 503;\n"
            if rule.admitted
            else ""
        )
        refused_message = (
            f"Content-Type not accepted by lane {rule.lane}: send one of {', '.join(accepted_types(rule.media))} "
            "(a form or multipart body is never read)"
        )
        refused = f"return 415 {_json(415, 'UnsupportedMediaType', refused_message)};"
        too_large = _json(
            413,
            "PayloadTooLarge",
            f"request body over {rule.body_bytes} bytes, the limit of lane {rule.lane} (handler.max_request_bytes)",
        )
        text += f"""
        location ~ ^/predictions/{rule.lane}(/[^/]*)?$ {{
{bulk}            client_max_body_size {rule.body_bytes};
    {errors.with_413(f"{ERROR_PATH}/413/{rule.lane}").replace(chr(10), chr(10) + "    ")}
{guard}            if (${_refused_variable(rule.media)}) {{
                {refused}
            }}
            proxy_pass http://{upstream};
        }}
        location = {ERROR_PATH}/413/{rule.lane} {{ internal; return 413 {too_large}; }}
"""
    not_found = _json(404, "NotFound", f"no such route: this API serves /ping and /predictions/<lane> for lanes {lanes}")
    text += f"""
        location / {{
            return 404 {not_found};
        }}
    }}
"""
    return text


def _management_server(address: str, errors: ErrorPages) -> str:
    refused = _json(415, "UnsupportedMediaType", "the management API takes its parameters in the URL: no form or multipart body")
    return f"""
    server {{
        listen {address} reuseport;
        limit_conn per_client 32;
        client_max_body_size {MANAGEMENT_BODY_BYTES};
{errors.directives}
{errors.locations}
        location / {{
            if ($form_body) {{
                return 415 {refused};
            }}
            proxy_pass http://torchserve_management;
        }}
    }}
"""


def _metrics_server(address: str, errors: ErrorPages) -> str:
    return f"""
    server {{
        listen {address} reuseport;
        limit_conn per_client 16;
        client_max_body_size 1k;
{errors.directives}
{errors.locations}
        location = /metrics {{
            limit_except GET {{
                deny all;
            }}
            proxy_pass http://torchserve_metrics;
        }}
        location / {{
            return 404 {_json(404, "NotFound", "the metrics listener serves GET /metrics only")};
        }}
    }}
"""


# The front door's own refusals on gRPC, as gRPC statuses (clients read grpc-status, not the HTTP status).
GRPC_ERRORS = {
    413: (8, "RESOURCE_EXHAUSTED", "request over {body_bytes} bytes, the largest limit of any lane"),
    429: (8, "RESOURCE_EXHAUSTED", f"too many requests in flight (at most {PER_CLIENT_REQUESTS} per client), retry later"),
    # TorchServe resets a call whose message is over max_request_size before nginx has read it all; nginx sees
    # the reset as it sees a server that is down.
    502: (
        14,
        "UNAVAILABLE",
        "TorchServe refused the call or did not answer: a message over {body_bytes} bytes is refused so, "
        "else it may be starting or stopped",
    ),
    504: (4, "DEADLINE_EXCEEDED", f"TorchServe did not answer within {UPSTREAM_TIMEOUT_S} s"),
}


def _grpc_server(name: str, address: str, body_bytes: int) -> str:
    pages = "\n".join(f"        error_page {code} {ERROR_PATH}/grpc/{code};" for code in GRPC_ERRORS)
    locations = "\n".join(
        f"        location = {ERROR_PATH}/grpc/{code} {{ internal; default_type application/grpc; "
        f'add_header grpc-status {status} always; add_header grpc-message "{message.format(body_bytes=body_bytes)}" always; '
        "return 204; }"
        for code, (status, _, message) in GRPC_ERRORS.items()
    )
    return f"""
    server {{
        listen {address} http2 reuseport;
        limit_conn per_client {PER_CLIENT_REQUESTS};
        limit_conn per_listener {PER_LISTENER_REQUESTS};
        client_max_body_size {body_bytes};
        http2_max_concurrent_streams 128;
{pages}
{locations}
        location /{GRPC_SERVICES[name]}/ {{
            grpc_pass grpc://torchserve_{name};
        }}
    }}
"""


def local(address: str) -> str:
    """host:port to connect to: loopback for a listener on every interface."""
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "", "[::]") else address


def nginx_binary() -> Path:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found is None:
        raise ConfigError(f"nginx not found: {INSTALL_NGINX}")
    return Path(found)


@dataclass
class FrontDoor:
    """nginx run from `folder` (its config, pid file and temporary bodies) before the TorchServe of `config`."""

    config: Path
    folder: Path
    process: subprocess.Popen | None = None

    @property
    def conf(self) -> Path:
        return self.folder / "nginx.conf"

    def write(self) -> Path:
        config = ServerConfig.read(self.config)
        listen = front_door_addresses(config, os.environ)
        if not listen:
            raise ConfigError(f"{self.config} names no front door: add front_door_inference_address=http://host:port")
        self.folder.mkdir(parents=True, exist_ok=True)
        # Descriptors per worker: what this process may give it (raising the hard limit needs a privilege).
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nofile = NOFILE if hard == resource.RLIM_INFINITY else min(NOFILE, hard)
        self.conf.write_text(render(config, listen, torchserve_addresses(config, os.environ), nofile=nofile))
        return self.conf

    def _command(self, *extra: str, daemon: bool = False) -> list[str]:
        # As root, nginx's workers would switch to `nobody`; they need nothing but sockets and the folder here.
        directives = ("daemon on;" if daemon else "daemon off;") + (" user root;" if os.geteuid() == 0 else "")
        log = str(self.folder / "nginx.out") if daemon else "stderr"
        return [str(nginx_binary()), "-p", f"{self.folder}/", "-c", str(self.conf), "-e", log, "-g", directives, *extra]

    def start(self, daemon: bool = False) -> None:
        """Waits until the inference listener answers. Daemon: nginx detaches (`make serve`; stop() reads its pid
        file); else our child in a session of its own (tests)."""
        self.write()
        checked = subprocess.run(self._command("-t"), capture_output=True, text=True)
        if checked.returncode != 0:
            raise ServerError(f"nginx refused {self.conf}: {checked.stderr.strip()}")
        if daemon:
            # It outlives us: it must not hold our stdout (a pipe would never close).
            with open(self.folder / "nginx.out", "ab") as log:
                started = subprocess.run(
                    self._command(daemon=True), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            if started.returncode != 0:
                tail = (self.folder / "nginx.out").read_text().strip().splitlines()[-1:]
                raise ServerError(
                    f"nginx did not start (status {started.returncode}): {' '.join(tail)} "
                    "(is a front door already running? `make stop`)"
                )
        else:
            with open(self.folder / "nginx.out", "ab") as log:
                self.process = subprocess.Popen(
                    self._command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
                )
        self.wait_ready()

    def wait_ready(self, timeout: float = 20.0) -> None:
        address = local(front_door_addresses(ServerConfig.read(self.config), os.environ)["inference"])
        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise ServerError(f"nginx exited with {self.process.returncode}: see {self.folder / 'nginx.out'}")
            try:
                requests.get(f"http://{address}/ping", timeout=2)
                return
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise ServerError(
                    f"the front door did not answer on {address} in {timeout:.0f}s: see {self.folder / 'nginx.out'}"
                )
            time.sleep(0.1)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """nginx's graceful quit (SIGQUIT: no new connections, requests in flight answered), SIGKILL after `timeout`."""
        if self.process is not None:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGQUIT)
                try:
                    self.process.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    stop_process_group(self.process, timeout=1.0)
            self.process = None
        elif (self.folder / "nginx.pid").exists():
            subprocess.run(self._command("-s", "quit"), check=False, capture_output=True)


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("action", choices=["render"])
    parser.add_argument("--config", type=Path, default=ROOT / "config.properties")
    parser.add_argument("--out", type=Path, default=BUILD / "front-door" / "nginx.conf")
    args = parser.parse_args()
    door = FrontDoor(args.config, args.out.parent)
    print(door.write())
    return 0


if __name__ == "__main__":
    cli.run(main)
