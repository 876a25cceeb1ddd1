"""Peak memory of a TorchServe worker per request: the worst requests under max_request_size on each lane.

    python -m scripts.hardening.worker_memory                  # every lane of every model, a throwaway server
    python -m scripts.hardening.worker_memory --lanes digits   # only some lanes

The requests come from each lane's own limits (its archive's model-config.yaml: rows, bytes, pixels, text bytes
and tokens), through its task's worst cases (TASK_PROBES; a task without its own there gets its model's largest
sample instance repeated to the lane's row and byte limits, so a new task needs no edit here) and those every lane
shares (bodies of empty objects filling its byte limit and max_request_size). For each request, every worker of the
lane gets its peak RSS reset (writing 5 to /proc/<pid>/clear_refs), the request is sent alone, and the answering
worker (X-Worker-Pid) reports VmRSS and VmHWM (the peak) from /proc/<pid>/status. Linux only. The figures are in
docs/hardening.md, "Limits"; each lane's worst is its worker_peak_mib in models/<name>/model.yaml.
"""

from __future__ import annotations

import base64
import io
import math
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from PIL import Image, ImageDraw

from handlers.headers import REPORT_WORKER_PID, WORKER_PID
from models import registry
from scripts import cli
from scripts.archive.reader import MarFile
from scripts.clients.rest import predict
from scripts.errors import ScriptError
from scripts.layout import MODEL_STORE
from scripts.server.config import ServerConfig
from scripts.server.endpoints import Endpoints
from scripts.server.temporary import serving_in
from scripts.swap.management import ManagementApi

JSON = "application/json"
HEAD, TAIL = b'{"instances": [', b"]}"
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


def fill(limit: int, item: bytes) -> bytes:
    """As many `item`s as fit in `limit` bytes, as a JSON instances body."""
    return rows_of((limit - len(HEAD) - len(TAIL)) // (len(item) + 1), item)


def instances_of(items: list[bytes]) -> bytes:
    return HEAD + b",".join(items) + TAIL


def rows_of(count: int, item: bytes) -> bytes:
    """`count` copies of `item` as a JSON instances body, repeated as bytes: no list of millions of references."""
    return HEAD + item + (b"," + item) * (count - 1) + TAIL


def digit_png(size: int) -> bytes:
    """A size x size PNG of a drawn ring: the most pixels per byte a real-looking digit image has."""
    image = Image.new("1", (size, size), 1)
    ImageDraw.Draw(image).ellipse((size // 4, size // 6, 3 * size // 4, 5 * size // 6), outline=0, width=max(1, size // 16))
    return _saved(image, "PNG", optimize=True)


def photo_jpeg(side: int) -> bytes:
    """A side x side colour JPEG of smooth gradients: the most pixels per byte a photograph-like file has."""
    ramp = Image.linear_gradient("L").resize((side, side))
    image = Image.merge("RGB", (ramp, ramp.rotate(90), ramp.rotate(180)))
    return _saved(image, "JPEG", quality=75)


def _saved(image: Image.Image, kind: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=kind, **options)
    return buffer.getvalue()


def b64_item(data: bytes) -> bytes:
    return orjson.dumps({"b64": base64.b64encode(data).decode()})


def text_rows(count: int, size: int) -> bytes:
    return rows_of(count, orjson.dumps(("word " * (size // 5 + 1))[:size]))


@dataclass(frozen=True)
class Limits:
    """What a lane admits (its archive's model-config.yaml, resolved for the lane) and the server's max_request_size."""

    lane: str
    task: str
    rows: int | None
    bytes: int | None
    options: Mapping[str, Any]
    request_size: int
    samples: tuple[Any, ...] = ()  # the lane's model's sample instances (models/<name>/samples.json)

    @classmethod
    def of(cls, lane: str, request_size: int) -> Limits:
        found, _ = registry.lane(lane)
        settings = MarFile(MODEL_STORE / f"{found.name}.mar").settings()
        rows, size = settings.rows_for(lane), settings.bytes_for(lane)
        return cls(lane, settings.task, rows, size, settings.task_options, request_size, found.samples().instances)

    @property
    def refuses_on_size(self) -> bool:
        """A body of max_request_size is over the lane's own byte limit: refused unread (a bulk lane parses it)."""
        return self.bytes is not None and self.bytes < self.request_size

    @property
    def body(self) -> int:
        """The most bytes a body may have on this lane."""
        return min(self.bytes or self.request_size, self.request_size)

    def fitting(self, count: int, item: bytes) -> int:
        """How many of `item` (up to `count`) an instances body within the lane's bytes holds."""
        return max(1, min(count, (self.body - 32) // (len(item) + 1)))


# A task's worst requests for a lane: {task: Limits -> [Probe]}. TorchServe's worker hands every body to the handler
# as bytes (handlers/torchserve/torchserve_handler.py): a lane refuses a body over its max_request_bytes on its size;
# one within it is parsed (orjson), then refused on rows.
ROW = b"[" + b",".join([b"0.5"] * 64) + b"]"  # one digits row, 64 floats (fresh float objects when parsed)


def digit_probes(limits: Limits) -> list[Probe]:
    lane, rows = limits.lane, limits.rows or 1024
    side = math.isqrt(limits.options.get("max_image_pixels", 1 << 20))
    large = max(1, min(rows, limits.options.get("max_request_pixels", 1 << 24) // side**2 - 1))
    small, big = b64_item(digit_png(8)), b64_item(digit_png(side))
    images = limits.fitting(rows - large, small)
    return [
        Probe(lane, f"{rows} rows of 64 floats", lambda _: rows_of(rows, ROW), JSON),
        Probe(
            lane,
            f"{large + images} b64 images: {large} of {side}x{side}, {images} of 8x8",
            lambda _: instances_of([big] * large + [small] * images),
            JSON,
        ),
        Probe(lane, f"one {side}x{side} PNG", lambda _: digit_png(side), "image/png"),
    ]


def text_probes(limits: Limits) -> list[Probe]:
    lane, rows = limits.lane, limits.rows or 1024
    size = limits.options.get("max_text_bytes", 64 * 1024)
    tokens = limits.options.get("max_seq_length", 256)
    item = orjson.dumps("x" * size)
    full = limits.fitting(rows, item)
    probes = [
        Probe(lane, f"{full} texts of {size // 1024} KiB", lambda _: text_rows(full, size), JSON),
        Probe(lane, f"{rows} texts of {tokens} tokens", lambda _: text_rows(rows, tokens * 5 + 20), JSON),
        Probe(lane, f"one text of {size // 1024} KiB", lambda _: ("word " * (size // 5 + 1)).encode()[:size], "text/plain"),
    ]
    # More texts of the largest size than the lane's bytes allow, within max_request_size: refused on the body's size.
    if full < rows and rows * (len(item) + 1) + 32 <= limits.request_size:
        over = Probe(lane, f"{rows} texts of {size // 1024} KiB (413 on its size)", lambda _: text_rows(rows, size), JSON)
        probes.insert(0, over)
    return probes


def image_probes(limits: Limits) -> list[Probe]:
    lane, rows = limits.lane, limits.rows or 256
    pixels = limits.options.get("max_image_pixels", 1 << 24)
    side = math.isqrt(pixels)
    photo = b64_item(photo_jpeg(side))
    count = limits.fitting(min(rows, limits.options.get("max_request_pixels", pixels) // side**2), photo)
    return [
        Probe(lane, f"{count} b64 JPEGs of {side}x{side}", lambda _: instances_of([photo] * count), JSON),
        Probe(lane, f"one {side}x{side} JPEG", lambda _: photo_jpeg(side), "image/jpeg"),
    ]


def sample_probes(limits: Limits) -> list[Probe]:
    """For a task without probes of its own: the model's largest sample instance (as JSON), as many times as the
    lane's rows and bytes allow, and once alone. A task's own probes know its costly inputs (the most pixels, the
    longest texts) and are better; these size a new task's lane from what it really serves."""
    if not limits.samples:
        raise ScriptError(
            f"no worst-case requests for task {limits.task!r} on {limits.lane}: its model has no samples "
            f"(models/<name>/samples.json) and the task no probes in TASK_PROBES ({__file__})"
        )
    item = max((orjson.dumps(instance) for instance in limits.samples), key=len)
    count = limits.fitting(limits.rows or 1024, item)
    return [
        Probe(limits.lane, f"{count} of its largest sample ({len(item)} bytes)", lambda _: rows_of(count, item), JSON),
        Probe(limits.lane, f"its largest sample alone ({len(item)} bytes)", lambda _: rows_of(1, item), JSON),
    ]


TASK_PROBES: dict[str, Callable[[Limits], list[Probe]]] = {
    "digit_classification": digit_probes,
    "text_embedding": text_probes,
    "image_classification": image_probes,
}


def probes_for(limits: Limits) -> list[Probe]:
    """The lane's task's worst cases (its model's samples where the task has none here), then those every lane
    shares."""
    refused = "413 on its size" if limits.refuses_on_size else "parsed, then 413 on rows"
    shared = [Probe(limits.lane, f"max_request_size of {{}} ({refused})", lambda limit: fill(limit, b"{}"), JSON)]
    if limits.refuses_on_size:
        shared.append(
            Probe(limits.lane, "max_request_bytes of {} (parsed, then 413 on rows)", lambda _: fill(limits.bytes, b"{}"), JSON)
        )
    return TASK_PROBES.get(limits.task, sample_probes)(limits) + shared


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
    for lane in lanes:
        for probe in probes_for(Limits.of(lane, limit)):
            yield measure(endpoints, probe, limit)


def table_row(reading: Reading) -> str:
    mib = lambda value: f"{value / MIB:,.0f}"  # noqa: E731
    return (
        f"| {reading.probe.lane} | {reading.probe.name} | {reading.body_bytes / MIB:.1f} | {reading.status} | "
        f"{reading.seconds:.1f} | {mib(reading.rss_before)} | {mib(reading.peak)} | {mib(reading.peak - reading.rss_before)} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    known = [lane.name for lane in registry.lanes()]
    parser.add_argument("--lanes", nargs="+", choices=known, default=known, help="default: every lane of every model")
    args = parser.parse_args(argv)
    limit = ServerConfig.read().max_request_size
    print("| lane | request | body MiB | status | seconds | RSS before MiB | peak RSS MiB | peak - before MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    models = {registry.lane(lane)[0].name for lane in args.lanes}
    archives = {f"{model}.mar": MODEL_STORE / f"{model}.mar" for model in sorted(models)}
    with tempfile.TemporaryDirectory(prefix="torchserve-memory-") as folder:
        with serving_in(Path(folder), archives) as server:
            for reading in readings(server.endpoints, args.lanes, limit):
                print(table_row(reading), flush=True)
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
