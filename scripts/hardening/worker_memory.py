"""Peak memory of a TorchServe worker per request: the worst requests under max_request_size on each lane.

    python -m scripts.hardening.worker_memory                  # a throwaway server with model_store's archives
    python -m scripts.hardening.worker_memory --lanes digits   # only some lanes

For each request, every worker of the lane gets its peak RSS reset (writing 5 to /proc/<pid>/clear_refs),
the request is sent alone, and the answering worker (X-Worker-Pid) reports VmRSS and VmHWM (the peak) from
/proc/<pid>/status. Linux only. The figures are in docs/hardening.md, "Limits".
"""

from __future__ import annotations

import base64
import io
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
from PIL import Image, ImageDraw

from handlers.headers import REPORT_WORKER_PID, WORKER_PID
from scripts import cli
from scripts.archive.reader import MarFile
from scripts.clients.rest import predict
from scripts.layout import MODEL_STORE
from scripts.server.config import ServerConfig
from scripts.server.endpoints import Endpoints
from scripts.server.temporary import serving_in
from scripts.swap.management import ManagementApi

JSON = "application/json"
MIB = 1024 * 1024


@dataclass(frozen=True)
class Probe:
    lane: str
    name: str
    build: Callable[[int], bytes]  # max_request_size -> body
    media: str


@dataclass(frozen=True)
class Reading:
    probe: Probe
    body_bytes: int
    status: int
    seconds: float
    rss_before: int  # bytes, the answering worker before the request
    peak: int  # bytes, VmHWM while the request ran
    rss_after: int


def fill(limit: int, item: bytes, head: bytes = b'{"instances": [', tail: bytes = b"]}") -> bytes:
    """As many `item`s as fit in `limit` bytes, as a JSON instances body."""
    count = (limit - len(head) - len(tail)) // (len(item) + 1)
    return head + b",".join([item] * count) + tail


def instances_of(items: list[bytes]) -> bytes:
    return b'{"instances": [' + b",".join(items) + b"]}"


def rows_of(count: int, item: bytes) -> bytes:
    return instances_of([item] * count)


def digit_png(size: int) -> bytes:
    """A size x size PNG of a drawn ring: the most pixels per byte a real-looking digit image has."""
    image = Image.new("1", (size, size), 1)
    ImageDraw.Draw(image).ellipse((size // 4, size // 6, 3 * size // 4, 5 * size // 6), outline=0, width=max(1, size // 16))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def b64_item(data: bytes) -> bytes:
    return orjson.dumps({"b64": base64.b64encode(data).decode()})


def image_rows(count: int, large: int) -> bytes:
    """`large` 1024x1024 images (15 leave room in the per-request pixel budget), then 8x8 ones up to `count` rows."""
    return instances_of([b64_item(digit_png(1024))] * large + [b64_item(digit_png(8))] * (count - large))


def text_rows(count: int, size: int) -> bytes:
    return rows_of(count, orjson.dumps(("word " * (size // 5 + 1))[:size]))


def lane_bytes(lane: str) -> int:
    """The lane's handler.max_request_bytes, from its archive's model-config.yaml in the model store."""
    model = lane.removesuffix("-bulk")
    limit = MarFile(MODEL_STORE / f"{model}.mar").settings().bytes_for(lane)
    if limit is None:
        raise ValueError(f"lane {lane} has no handler.max_request_bytes")
    return limit


ROW = b"[" + b",".join([b"0.5"] * 64) + b"]"  # one digits row, 64 floats (fresh float objects when parsed)
# TorchServe's worker hands every body to the handler as bytes (handlers/torchserve/torchserve_handler.py): a stream lane
# refuses a body over its max_request_bytes on its size; one within it is parsed (orjson), then refused on rows.
PROBES = [
    Probe("digits", "1024 rows of 64 floats", lambda limit: rows_of(1024, ROW), JSON),
    Probe("digits", "1024 b64 images: 15 of 1024x1024, 1009 of 8x8", lambda limit: image_rows(1024, 15), JSON),
    Probe("digits", "one 1024x1024 PNG", lambda limit: digit_png(1024), "image/png"),
    Probe("digits", "max_request_size of {} (413 on its size)", lambda limit: fill(limit, b"{}"), JSON),
    Probe("digits", "max_request_bytes of {} (parsed, then 413 on rows)", lambda limit: fill(lane_bytes("digits"), b"{}"), JSON),
    Probe("digits-bulk", "200000 rows of 64 floats", lambda limit: rows_of(200_000, ROW), JSON),
    Probe("digits-bulk", "max_request_size of {} (parsed, then 413 on rows)", lambda limit: fill(limit, b"{}"), JSON),
    Probe("minilm", "32 texts of 64 KiB (over max_request_bytes: 413 on its size)", lambda limit: text_rows(32, 64 * 1024), JSON),
    Probe(
        "minilm",
        "max_request_bytes of 64 KiB texts",
        lambda limit: text_rows(lane_bytes("minilm") // (64 * 1024 + 3) - 1, 64 * 1024),
        JSON,
    ),
    Probe("minilm", "32 texts of 256 tokens", lambda limit: text_rows(32, 1300), JSON),
    Probe("minilm", "one text of 64 KiB", lambda limit: ("word " * 13108).encode()[: 64 * 1024], "text/plain"),
    Probe("minilm", "max_request_size of {} (413 on its size)", lambda limit: fill(limit, b"{}"), JSON),
    Probe("minilm", "max_request_bytes of {} (parsed, then 413 on rows)", lambda limit: fill(lane_bytes("minilm"), b"{}"), JSON),
    Probe("minilm-bulk", "1023 texts of 64 KiB", lambda limit: text_rows(1023, 64 * 1024), JSON),
    Probe("minilm-bulk", "1024 texts of 256 tokens", lambda limit: text_rows(1024, 1300), JSON),
    Probe("minilm-bulk", "max_request_size of {} (parsed, then 413 on rows)", lambda limit: fill(limit, b"{}"), JSON),
]


def status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(f"{field} not in /proc/{pid}/status")


def measure(endpoints: Endpoints, probe: Probe, limit: int) -> Reading:
    body = probe.build(limit)
    if len(body) > limit:
        raise ValueError(f"{probe.name}: {len(body)} bytes, over max_request_size {limit}")
    pids = ManagementApi(endpoints).worker_pids(probe.lane)
    before = {}
    for pid in pids:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        before[pid] = status_bytes(pid, "VmRSS")
    started = time.perf_counter()
    reply = predict(endpoints, probe.lane, body, probe.media, timeout=900, headers={REPORT_WORKER_PID: "1"})
    seconds = time.perf_counter() - started
    pid = int(reply.headers[WORKER_PID])
    return Reading(
        probe, len(body), reply.status_code, seconds, before[pid], status_bytes(pid, "VmHWM"), status_bytes(pid, "VmRSS")
    )


def readings(endpoints: Endpoints, lanes: list[str], limit: int) -> Iterator[Reading]:
    for probe in PROBES:
        if probe.lane in lanes:
            yield measure(endpoints, probe, limit)


def table_row(reading: Reading) -> str:
    mib = lambda value: f"{value / MIB:,.0f}"  # noqa: E731
    return (
        f"| {reading.probe.lane} | {reading.probe.name} | {reading.body_bytes / MIB:.1f} | {reading.status} | "
        f"{reading.seconds:.1f} | {mib(reading.rss_before)} | {mib(reading.peak)} | {mib(reading.peak - reading.rss_before)} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--lanes", nargs="+", default=["digits", "digits-bulk", "minilm", "minilm-bulk"])
    args = parser.parse_args(argv)
    limit = ServerConfig.read().max_request_size
    print("| lane | request | body MiB | status | seconds | RSS before MiB | peak RSS MiB | peak - before MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    archives = {name: MODEL_STORE / name for name in ("digits.mar", "minilm.mar")}
    with tempfile.TemporaryDirectory(prefix="torchserve-memory-") as folder:
        with serving_in(Path(folder), archives) as server:
            for reading in readings(server.endpoints, args.lanes, limit):
                print(table_row(reading), flush=True)
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
