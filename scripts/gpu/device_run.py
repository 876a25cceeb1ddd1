"""The measurements of one device call, run on the GPU machine by scripts/gpu/device_call.sh (docs/gpu.md,
"Prepared device calls"); each part writes <part>.json into --out ($OUT there).

    python -m scripts.gpu.device_run --part <model> --out DIR [--seconds 1.0] [--cpu-dry-run]

For one model in models/, from what build/gpu-device/<model>/ carries (scripts/gpu/device_prep.py), in this order
(each result written as soon as it exists, so a call stopped at its limit still returns what it measured):
1. graphs: ms per call in process at 1, 2, 8 rows and the lane's batchSize, eager against CUDA graphs, their
   answers' largest difference, the graphs' memory and capture time;
2. served: TorchServe from the serving bundle on the GPU, wrk at 1 connection (p50) and 64 (req/s), for the
   stream lane, the same lane with CUDA graphs, and a no-op handler with the same batching on the same
   frontend, against the in-process pipeline at the lane's batch size; the bulk lane's rows/s against the core
   in process on the same requests (4,096 rows, or the lane's row limit); which processes hold the GPU;
3. precision: ms per call in process at 1 and 8 rows and rows/s at 64, 512 and 4,096 rows, for fp32, bf16 and
   fp16 under autocast and with the weights cast once (an exported <stem>.<precision>.pt2, cast_weights); each half
   precision also with the model's precision_variants (minilm: without cuDNN's attention, sdpa_backends).
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson
import requests
import torch

from handlers.core import InferenceCore
from handlers.decoding import Payload
from models import registry
from models.portable import of
from scripts import cli
from scripts.archive.reader import MarFile
from scripts.archive.variant import write_variant
from scripts.bench import loadgen
from scripts.bench.pipeline import pipeline
from scripts.bench.stream import check_answer, lane_entry, request_body, served_lanes
from scripts.errors import ScriptError
from scripts.gpu import models as gpu_models
from scripts.gpu.bundle import ARCHIVE_FILES, ITEMS
from scripts.gpu.device_prep import COMMON
from scripts.gpu.device_prep import OUT as CARRIED
from scripts.layout import BUILD, JSON, ROOT
from scripts.server.config import ServerConfig
from scripts.server.temporary import serving_in

WORK = BUILD / "gpu-device-run"
ROWS_PER_CALL = (1, 8)
GRAPH_ROWS = (1, 2, 8)
BULK_ROWS = 4096


# -- archives assembled here ---------------------------------------------------------------------


def with_working_tree_handlers(entries: dict[str, bytes], target: Path) -> Path:
    """A .mar of `entries` whose handler code is this working tree's (handlers/ and the adapter), digest recorded."""
    code = {f"handlers/{p.relative_to(ROOT / 'handlers')}": p.read_bytes() for p in (ROOT / "handlers").rglob("*.py")}
    code["torchserve_handler.py"] = (ROOT / "handlers" / "torchserve" / "torchserve_handler.py").read_bytes()
    kept = {name: data for name, data in entries.items() if not name.startswith("handlers/")}
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as mar:
        for name, data in {**kept, **code}.items():
            mar.writestr(name, data)
    MarFile(target).record_digest()
    return target


def assemble(name: str, carried: Path | None = None) -> tuple[Path, torch.nn.Module]:
    """<name>.mar around a .pt2 exported here from the carried plain weights, with the carried archive entries and
    this working tree's handler code; and the eager module."""
    folder = carried or CARRIED / name
    portable = of(name)
    eager = portable.eager(folder)
    program, _ = gpu_models.write_format(portable, eager, "export", WORK / f"{name}-files", torch.device("cpu"))
    entries_folder = folder / ARCHIVE_FILES
    entries = {p.relative_to(entries_folder).as_posix(): p.read_bytes() for p in entries_folder.rglob("*") if p.is_file()}
    model_file = registry.model(name).handler_config()["handler"]["model_file"]
    if program.name != model_file:
        raise ScriptError(f"{name}: the exported {program.name} is not the archive's model_file {model_file}")
    entries[model_file] = program.read_bytes()
    return with_working_tree_handlers(entries, WORK / name / f"{name}.mar"), eager


def variant(archive: Path, name: str, handler: dict[str, Any], extra_files: dict[str, Path] | None = None) -> Path:
    """`archive` with handler settings changed (and model files added), as <model>-<name>.mar."""
    target = archive.with_name(f"{archive.stem}-{name}.mar")
    write_variant(archive, target, handler)
    if extra_files:
        with zipfile.ZipFile(target, "a") as mar:
            for entry, path in extra_files.items():
                mar.write(path, entry)
        MarFile(target).record_digest()
    return target


# -- in process ----------------------------------------------------------------------------------


def core_of(archive: Path) -> InferenceCore:
    from scripts.archive.core import load_core

    return load_core(archive)


def payload(name: str, rows: int) -> Payload:
    """`rows` of the model's carried items, cycled, after the sample its stream bench sends (model.yaml's
    bench.request), so a figure at 1 row times the benches' request."""
    found = registry.model(name)
    items = [found.samples().instances[found.bench["request"]], *json.loads((CARRIED / name / ITEMS).read_text())]
    return Payload(items=gpu_models.cycled(items, rows), raw=False)


def answered(core: InferenceCore, request: Payload) -> Callable[[], Any]:
    """A timed call of `request`, checked once to be answered 200 (a refused request would be timed as fast)."""
    [response] = core.answer([request])
    if response.status != 200:
        raise ScriptError(f"{len(request.items)} rows answered {response.status}: {str(response.body)[:200]}")
    return lambda: core.answer([request])


def ms_per_call(call: Callable[[], Any], seconds: float) -> float:
    """The median of calls for `seconds` (after five warm-up calls), in milliseconds."""
    for _ in range(5):
        call()
    times, started = [], time.perf_counter()
    while time.perf_counter() - started < seconds or len(times) < 5:
        begun = time.perf_counter()
        call()
        times.append(time.perf_counter() - begun)
    return statistics.median(times) * 1000


def core_row(core: InferenceCore, model: str, seconds: float) -> dict[str, float]:
    row: dict[str, float] = {}
    for rows in ROWS_PER_CALL:
        row[f"ms_at_{rows}"] = round(ms_per_call(answered(core, payload(model, rows)), seconds), 4)
    for rows in of(model).throughput_rows:
        row[f"rows_s_at_{rows}"] = round(rows * 1000 / ms_per_call(answered(core, payload(model, rows)), seconds))
    return row


def precision_part(model: str, archive: Path, eager: torch.nn.Module, seconds: float, write) -> None:
    portable = of(model)
    rows: dict[str, dict] = {}
    for precision in ("fp32", "bf16", "fp16"):
        settings: dict[str, Any] = {"precision": precision}
        rows[f"{precision} autocast" if precision != "fp32" else "fp32"] = core_row(
            core_of(variant(archive, precision, settings)), model, seconds
        )
        write(rows)
        if precision == "fp32":
            continue
        cast_file, _ = gpu_models.write_format(portable, eager, "export", WORK / f"{model}-files", torch.device("cpu"), precision)
        cast = {"precision": precision, "cast_weights": True, "model_file": cast_file.name}
        rows[f"{precision} cast once"] = core_row(
            core_of(variant(archive, f"{precision}-cast", cast, {cast_file.name: cast_file})), model, seconds
        )
        write(rows)
        for number, (label, changes) in enumerate(portable.precision_variants.items()):
            for how, change in ((f"{precision} autocast", settings), (f"{precision} cast once", cast)):
                extra = {cast_file.name: cast_file} if "cast_weights" in change else None
                name = f"{precision}-{'cast-' if extra else ''}variant{number}"
                changed = variant(archive, name, {**change, **changes}, extra)
                rows[f"{how}, {label}"] = core_row(core_of(changed), model, seconds)
                write(rows)


def graphs_part(model: str, archive: Path, batch_size: int, seconds: float, write) -> None:
    eager, graphed = core_of(archive), core_of(archive)
    started = time.perf_counter()
    runner = graphed.capture_graphs(batch_size)
    result: dict[str, Any] = {
        "buckets": len(runner.graphs),
        "capture_s": round(time.perf_counter() - started, 2),
        "graph_memory_mib": round(runner.memory_bytes / 2**20, 1),
        "rows": {},
    }
    for rows in (*GRAPH_ROWS, batch_size):
        one = payload(model, rows)
        [a], [b] = eager.answer([one]), graphed.answer([one])
        result["rows"][rows] = {
            "eager_ms": round(ms_per_call(lambda one=one: eager.answer([one]), seconds), 4),
            "graphs_ms": round(ms_per_call(lambda one=one: graphed.answer([one]), seconds), 4),
            "max_abs_difference": _max_difference(a.body, b.body),
        }
        write(result)


def _max_difference(first: dict, second: dict) -> float:
    return registry.largest_difference(first["predictions"], second["predictions"])


# -- served --------------------------------------------------------------------------------------


def gpu_processes() -> str:
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi on this machine"
    done = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv"], capture_output=True, text=True
    )
    return done.stdout.strip()


def served_part(model: str, archive: Path, seconds: float, write) -> None:
    found = registry.model(model)
    stream_name = found.stream_lane.name
    bulk_name = found.bulk_lane.name if found.bulk_lane else None
    lanes = ServerConfig.read().lane_settings(model)
    stream = lanes[stream_name]
    graphs = variant(archive, "graphs", {"cuda_graphs": {f"{stream_name}-graphs": True, "default": False}})
    entries = {
        stream_name: lane_entry(archive.name, stream, stream.batch_size),
        f"{stream_name}-graphs": lane_entry(graphs.name, stream, stream.batch_size),
        "noop": lane_entry("noop.mar", stream, stream.batch_size),
    }
    bulk = lanes[bulk_name] if bulk_name else None
    if bulk is not None:
        entries[bulk_name] = lane_entry(archive.name, bulk, bulk.batch_size)
    served = {"number_of_gpu": "1"} | served_lanes(entries)
    body = request_body(model)
    result: dict[str, Any] = {"lanes": {}, "stream_lane": asdict(stream), "bulk_lane": asdict(bulk) if bulk else None}
    measured = pipeline(archive, body, stream.batch_size, seconds)
    result["in_process"] = {"batch": stream.batch_size, "rps": round(measured.requests_per_second)}
    one, lone = core_of(archive), payload(model, 1)
    result["in_process"]["ms_at_1"] = round(ms_per_call(lambda: one.answer([lone]), seconds), 4)
    write(result)
    archives = {archive.name: archive, graphs.name: graphs, "noop.mar": CARRIED / COMMON / "noop.mar"}
    with serving_in(WORK / f"torchserve-{model}", archives, served) as server:
        result["gpu_processes"] = gpu_processes()
        token = server.endpoints.token("inference")
        for lane in (stream_name, f"{stream_name}-graphs", "noop"):
            target = loadgen.Target(server.endpoints.prediction_url(lane), body, JSON, token)
            if lane != "noop":
                reply = requests.post(target.url, data=body, headers=target.headers(), timeout=60)
                check_answer(model, reply, lane)
            loadgen.closed_loop(target, 64, 1.0)  # warm-up
            lone = loadgen.closed_loop(target, 1, seconds)
            loaded = loadgen.closed_loop(target, 64, seconds, threads=4)
            result["lanes"][lane] = {"p50_ms_at_1": lone.p50_ms, "rps_at_64": loaded.rps, "p99_ms_at_64": loaded.p99_ms}
            result["lanes"][lane]["errors"] = lone.errors + loaded.errors
            write(result)
        if bulk_name is not None:
            result["bulk"] = bulk_rows_per_second(server, model, bulk_name, archive, seconds)
            write(result)


def bulk_rows_per_second(server, model: str, lane: str, archive: Path, seconds: float) -> dict[str, float]:
    rows = min(BULK_ROWS, MarFile(archive).settings().rows_for(lane) or BULK_ROWS)  # the lane's limit
    chunk = payload(model, rows)
    body = orjson.dumps({"instances": chunk.items})
    url = server.endpoints.prediction_url(lane)
    headers = {"Content-Type": JSON, "Authorization": f"Bearer {server.endpoints.token('inference')}"}
    with requests.Session() as session:

        def post() -> None:
            reply = session.post(url, data=body, headers=headers, timeout=300)
            if reply.status_code != 200:
                raise ScriptError(f"{lane} answered {reply.status_code}: {reply.text[:200]}")

        served_ms = ms_per_call(post, seconds)
    core = core_of(archive)
    in_process_ms = ms_per_call(lambda: core.answer([chunk]), seconds)
    return {
        "rows_per_request": rows,
        "served_rows_s": round(rows * 1000 / served_ms),
        "in_process_rows_s": round(rows * 1000 / in_process_ms),
    }


# -- the call ------------------------------------------------------------------------------------


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--part", choices=list(registry.models()), required=True, help="a model in models/")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=1.0, help="each timed figure: the median of calls for this long")
    parser.add_argument("--cpu-dry-run", action="store_true", help="the served part only, on this CPU: checks the script")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.cpu_dry_run:
        raise ScriptError("the device run needs CUDA: torch.cuda.is_available() is False (--cpu-dry-run to check it here)")
    if WORK.exists():
        shutil.rmtree(WORK)
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.part

    def writer(name: str):
        def write(value) -> None:
            (args.out / f"{model}-{name}.json").write_text(json.dumps(value, indent=2, default=str))

        return write

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (dry run)"
    meta = {"torch": torch.__version__, "device": device, "seconds": args.seconds}
    writer("meta")(meta)
    archive, eager = assemble(model)
    batch_size = registry.model(model).stream_lane.batch_size
    parts = {
        "graphs": lambda: graphs_part(model, archive, batch_size, args.seconds, writer("graphs")),
        "served": lambda: served_part(model, archive, args.seconds, writer("served")),
        "precision": lambda: precision_part(model, archive, eager, args.seconds, writer("precision")),
    }
    for name, part in parts.items():
        if args.cpu_dry_run and name != "served":
            continue
        started = time.perf_counter()
        try:
            part()
            meta[f"{name}_s"] = round(time.perf_counter() - started, 1)
        except Exception as error:  # noqa: BLE001 - one part's failure must not lose the others' results
            meta[f"{name}_error"] = f"{type(error).__name__}: {error}"[:2000]
            print(f"{model} {name} failed: {meta[f'{name}_error']}", flush=True)
        writer("meta")(meta)
        print(f"{model} {name}: {meta.get(f'{name}_s', 'failed')}", flush=True)
    return 0


if __name__ == "__main__":
    cli.run(main)
