"""The CUDA path, checked on a real GPU: agreement with the CPU, out-of-memory survived, rows/s by batch size.

    python -m scripts.gpu.bundle                        # here: the models, inputs and CPU answers (build/gpu-bundle)
    python -m scripts.gpu.check [--out build/gpu-check] # there: CUDA, torch, numpy, pyyaml, pillow, tokenizers,
                                                        # transformers (the bundle's site/ brings the rest)

`make gpu-check` runs both, then the tests marked gpu. Without CUDA it stops at once with status 2 and says so
(`--dry-run` runs what the CPU allows, on the CPU, to try the script itself). Everything is printed and written
to <out>/gpu-check.json and <out>/gpu-check.md (the tables of docs/benchmarks.md's GPU section):

Every model in models/ takes part, as its folder declares (models/<name>/portable.py, models/portable.py):

1. agreement: each model's items (digits' 360 held-out rows, minilm's 240 varied sentences, the classifier's
   photographs) through the handler's core on CUDA against the CPU on the same weights, for every format this torch
   exports (each exported there from the plain weights), in fp32 and, where autocast reaches, bf16 and fp16, each
   by the model's own match for that precision;
2. out of memory: a per-process memory cap (torch.cuda.set_per_process_memory_fraction) sized from a measured
   forward pass, so a request of the model's oom_rows in one micro-batch (digits: 65,536, the export's own maximum)
   really runs out of device memory and must be split; per loader. Then, for a model with a long_item (minilm's
   text past 256 tokens), a cap found by search where that row does not fit even alone: its request fails (507),
   the request batched with it is answered;
3. speed: in-process rows/s by batch size (1 to 4,096), fp32/bf16/fp16, pinned non-blocking copies on and off
   (and each model's speed_options), and decode overlapped with the forward pass (a one-chunk prefetch) against
   decode-then-forward.

A time budget (--budget-s) keeps the run inside a lent machine's minutes: what does not fit is reported as
skipped, never silently dropped.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import platform
import random
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from handlers.core import InferenceCore, StageTimes
from handlers.decoding import Payload
from handlers.errors import RequestError
from models import registry
from models.portable import Portable, of
from scripts.gpu import models
from scripts.gpu.bundle import ARCHIVE_FILES, ITEMS, REFERENCE, SITE
from scripts.layout import BUILD

DEFAULT_BUNDLE = BUILD / "gpu-bundle"  # python -m scripts.gpu.bundle writes it there
DEFAULT_OUT = BUILD / "gpu-check"
EXIT_NO_CUDA = 2
FORMATS = ("export", "torchscript", "onnx", "aoti")
AUTOCAST_FORMATS = ("export", "torchscript")
BATCH_SIZES = (1, 8, 64, 512, 4096)
PRECISIONS = ("fp32", "bf16", "fp16")


class Report:
    """Sections of results, printed as they come and written as JSON and Markdown at the end."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.data: dict[str, Any] = {"failures": [], "skipped": []}
        self.lines: list[str] = []

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def fail(self, what: str) -> None:
        self.data["failures"].append(what)
        self.say(f"FAIL: {what}")

    def skip(self, what: str) -> None:
        self.data["skipped"].append(what)
        self.say(f"skipped: {what}")

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu-check.json").write_text(json.dumps(self.data, indent=2, default=str))
        (self.out / "gpu-check.md").write_text("\n".join(self.lines) + "\n")


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


# -- the check's parts ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Subject:
    """One model in the check: its declarations, eager module, items and the bundle's CPU answers."""

    name: str
    portable: Portable
    bundled: Path  # the bundle's folder for it
    eager: torch.nn.Module
    items: list[Any]
    reference: list[Any]


def set_precision(core: InferenceCore, precision: str) -> None:
    """Switch a loaded core's precision (autocast is decided at load from the settings)."""
    core.settings = dataclasses.replace(core.settings, precision=precision)
    core.autocast_dtype = core._autocast_dtype()


class Check:
    def __init__(
        self, bundle: Path, work: Path, device: torch.device, budget: Budget, report: Report, names: Sequence[str]
    ) -> None:
        self.bundle = bundle
        self.device = device
        self.budget = budget
        self.report = report
        self.work = work
        if self.work.exists():
            shutil.rmtree(self.work)
        self.work.mkdir(parents=True)
        self.subjects: dict[str, Subject] = {}
        for name in names:
            portable = of(name)
            bundled = bundle / name
            items = json.loads((bundled / ITEMS).read_text())
            reference = json.loads((bundled / REFERENCE).read_text())
            self.subjects[name] = Subject(name, portable, bundled, portable.eager(bundled), items, reference)
        self.formats = FORMATS
        self.aoti_models: tuple[str, ...] = tuple(names)
        self.reserve_s = 120.0
        self.batch_sizes = BATCH_SIZES
        self.files: dict[tuple[str, str], Path | None] = {}
        self.cpu_answers: dict[str, list[Any]] = {}

    def folder(self, name: str) -> Path:
        """The model's work folder: the archive's other entries (a tokenizer, class names) beside its files made here."""
        folder = self.work / name
        if not folder.exists():
            shutil.copytree(self.subjects[name].bundled / ARCHIVE_FILES, folder)
        return folder

    # 1. agreement

    def model_file(self, name: str, fmt: str) -> tuple[Path | None, str]:
        """The format's file, exported here from the plain weights by this torch. (path, how)."""
        note = {"aoti": f"compiled here for {self.device.type}", "torchscript": f"traced here on {self.device.type}"}
        note = note.get(fmt, "exported here")
        if fmt == "torchscript" and self.device.type == "cuda":
            try:
                note += f"; {self.cpu_traced_on_cuda(name)}"
            except Exception as error:  # noqa: BLE001 - the CPU trace itself failed: noted, the format still runs
                note += f"; tracing on the CPU failed: {type(error).__name__}: {str(error)[:160]}"
        subject = self.subjects[name]
        try:
            path, seconds = models.write_format(subject.portable, subject.eager, fmt, self.folder(name), self.device)
        except Exception as error:  # noqa: BLE001 - a format this torch cannot write is a finding, not a crash
            return None, f"cannot be made here: {type(error).__name__}: {str(error)[:300]}"
        return path, f"{note} ({seconds:.0f}s)"

    def cpu_traced_on_cuda(self, name: str) -> str:
        """What a TorchScript file traced on the CPU (as make archive traces it) does on this GPU."""
        subject = self.subjects[name]
        traced = self.work / "cpu-traced" / name
        shutil.copytree(subject.bundled / ARCHIVE_FILES, traced, dirs_exist_ok=True)
        path, _ = models.write_format(subject.portable, subject.eager, "torchscript", traced, torch.device("cpu"))
        try:
            core = InferenceCore.load(path.parent, models.settings(name, path.name), self.device)
            models.answers(core, subject.items[:8])
        except Exception as error:  # noqa: BLE001 - the finding
            return f"a CPU-traced file here: {type(error).__name__}: {str(error)[:220]}"
        return "a CPU-traced file runs here too"

    def compiled(self) -> None:
        """AOTInductor, last: compiling a transformer takes minutes, so it runs once the rest is in."""
        self.formats, self.reserve_s = ("aoti",), 0.0
        self.agreement(self.aoti_models)

    def cpu(self, name: str) -> list[Any]:
        """This machine's CPU answers on the bundle's weights, through the handler's core around the eager module."""
        if name not in self.cpu_answers:
            subject = self.subjects[name]
            settings = models.settings(name, f"{subject.portable.stem}.pt2")
            core = models.eager_core(subject.eager, settings, self.folder(name), torch.device("cpu"))
            self.cpu_answers[name] = models.answers(core, subject.items)
        return self.cpu_answers[name]

    def agreement(self, names: Sequence[str] | None = None) -> None:
        report = self.report
        report.say("## Agreement: CUDA against the CPU, same weights\n")
        report.say(
            "| model | format | precision | file | rows outside the match | largest difference to the CPU here | "
            "to the bundle's CPU | within bounds |"
        )
        report.say("| --- | --- | --- | --- | --- | --- | --- | --- |")
        results = []
        for name in self.subjects if names is None else names:
            subject = self.subjects[name]
            cpu = self.cpu(name)
            for fmt in self.formats:
                # Seconds a file takes to make there (AOTInductor compiles a transformer for minutes), plus what
                # the out-of-memory and speed parts need after it.
                needed = {"aoti": 180}.get(fmt, 20)
                if self.budget.left() < needed + self.reserve_s:
                    report.skip(f"agreement {name}/{fmt}: time budget")
                    continue
                if fmt == "onnx" and self.device.type == "cuda" and "CUDAExecutionProvider" not in onnx_providers():
                    how = f"not run: this onnxruntime has no CUDAExecutionProvider ({', '.join(onnx_providers()) or 'none'})"
                    report.say(f"| {name} | {fmt} | - | {how} | | | | not run |")
                    results.append({"model": name, "format": fmt, "file": how, "loaded": False})
                    self.files[(name, fmt)] = None
                    continue
                path, how = self.model_file(name, fmt)
                self.files[(name, fmt)] = path
                if path is None:
                    report.say(f"| {name} | {fmt} | - | {how} | | | | no file |")
                    results.append({"model": name, "format": fmt, "file": how, "loaded": False})
                    continue
                try:
                    core = InferenceCore.load(path.parent, models.settings(name, path.name), self.device)
                except Exception as error:  # noqa: BLE001
                    note = f"{type(error).__name__}: {str(error)[:200]}"
                    report.say(f"| {name} | {fmt} | - | does not load on {self.device}: {note} | | | | not run |")
                    results.append({"model": name, "format": fmt, "file": how, "loaded": False, "error": note})
                    continue
                for precision in PRECISIONS if fmt in AUTOCAST_FORMATS else ("fp32",):
                    if precision == "fp16" and self.device.type != "cuda":
                        continue
                    set_precision(core, precision)
                    served = models.answers(core, subject.items)
                    here = models.compare(subject.portable, precision, served, cpu)
                    there = models.compare(subject.portable, precision, served, subject.reference)
                    row = {"model": name, "format": fmt, "precision": precision, "file": how, "to_cpu": here}
                    row.update({"to_bundle_cpu": there, "within_bounds": here["within"]})
                    results.append(row)
                    report.say(
                        f"| {name} | {fmt} | {precision} | {how} | {here['rows_outside']} of {here['rows']} | "
                        f"{here['largest_difference']:.1e} | {there['largest_difference']:.1e} | "
                        f"{'yes' if here['within'] else 'NO'} |"
                    )
                    if not here["within"]:
                        report.fail(f"{name}/{fmt}/{precision} outside its match: {here}")
                del core
                release()
        self.report.data.setdefault("agreement", []).extend(results)

    # 2. out of memory

    def out_of_memory(self) -> None:
        report = self.report
        report.say("\n## Out of device memory, survived\n")
        if self.device.type != "cuda":
            report.skip("out-of-memory checks: they need CUDA")
            return
        results = []
        report.say(
            "| model | loader | rows in the request | memory cap | splits | forward passes (rows) | errors seen | answers = CPU |"
        )
        report.say("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, subject in self.subjects.items():
            if subject.portable.oom_rows is None:
                continue
            for fmt in self.formats:
                path = self.files.get((name, fmt))
                if path is None:
                    report.skip(f"out-of-memory {name} with {fmt}: no file (see agreement)")
                    continue
                if self.budget.left() < 60:
                    report.skip(f"out-of-memory {name} with {fmt}: time budget")
                    continue
                try:
                    results.append(self.split_under_cap(name, fmt, path))
                except Exception as error:  # noqa: BLE001 - a loader whose OOM is not survived is the finding
                    report.fail(f"out-of-memory {name} with {fmt}: {type(error).__name__}: {str(error)[:400]}")
                    results.append({"model": name, "format": fmt, "error": f"{type(error).__name__}: {str(error)[:400]}"})
                release()
        self.report.data["oom"] = results
        alone = {}
        for name, subject in self.subjects.items():
            long_item = subject.portable.long_item()
            if long_item is None:
                continue
            if self.budget.left() < 45:
                report.skip(f"a row too large alone ({name}): time budget")
                continue
            try:
                alone[name] = self.row_too_large_alone(name, long_item)
            except Exception as error:  # noqa: BLE001
                report.fail(
                    f"a row too large alone ({name}): {type(error).__name__}: {str(error)[:400]}\n{traceback.format_exc()[-800:]}"
                )
            release()
        self.report.data["oom_alone"] = alone

    def split_under_cap(self, name: str, fmt: str, path: Path) -> dict[str, Any]:
        """One request of the model's oom_rows in one micro-batch, under a cap with room for 2x the memory a pass of
        an eighth of them was measured to need: it must be split, and every answer equal the CPU's."""
        subject = self.subjects[name]
        rows = subject.portable.oom_rows
        changes = {"max_batch_rows": rows, "max_batch_tokens": None, "max_request_rows": None}
        core = InferenceCore.load(path.parent, models.settings(name, path.name, **changes), self.device)
        items = models.cycled(subject.items, rows)
        probe = items[: max(1, rows // 8)]
        models.answers(core, probe)
        release()
        baseline = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        models.answers(core, probe)
        peak = torch.cuda.max_memory_allocated(self.device) - baseline
        cap = baseline + 2 * peak + (64 << 20)
        errors: list[str] = []
        stages = StageTimes()
        with capture_warnings(errors), memory_cap(cap, self.device):
            responses = core.answer([Payload(items=items, raw=False), Payload(items=items[:1], raw=False)], stages)
        statuses = [r.status for r in responses]
        figures: dict[str, Any] = {"model": name, "format": fmt, "rows": rows, "cap_mib": cap >> 20}
        figures.update({"peak_probe_mib": peak >> 20, "probe_rows": len(probe), "statuses": statuses})
        figures.update({"oom_splits": stages.oom_splits, "forward_rows": sorted(set(stages.forward_rows)), "errors": errors})
        figures["answers_equal_cpu"] = False
        if statuses[0] == 200:
            served = responses[0].body["predictions"]
            compared = models.compare(subject.portable, "fp32", served, models.cycled(self.cpu(name), rows))
            figures["to_cpu"] = compared
            figures["answers_equal_cpu"] = compared["within"]
        self.report.say(
            f"| {name} | {fmt} | {rows:,} (+1) | {cap >> 20} MiB | {stages.oom_splits} | {len(stages.forward_rows)} "
            f"({', '.join(f'{n:,}' for n in sorted(set(stages.forward_rows)))}) | {'; '.join(sorted(set(errors)))[:160]} | "
            f"{'yes' if figures['answers_equal_cpu'] else 'NO'} |"
        )
        if statuses != [200, 200] or stages.oom_splits < 1 or not figures["answers_equal_cpu"]:
            self.report.fail(f"out-of-memory {name} with {fmt} not survived by splitting: {figures}")
        return figures

    def row_too_large_alone(self, name: str, long_item: Any) -> dict[str, Any]:
        """Under a cap where the model's long_item cannot run even alone, its request gets a 507 and the request of
        three short items batched with it is answered as without a cap."""
        subject = self.subjects[name]
        path = self.files.get((name, "export"))
        if path is None:
            raise RuntimeError(f"no {subject.portable.stem}.pt2 (see agreement)")
        core = InferenceCore.load(path.parent, models.settings(name, path.name), self.device)
        short = sorted(subject.items, key=lambda item: core.task.row_cost(core.decode(Payload(items=[item], raw=False))[0]))[:3]
        long_row = core.decode(Payload(items=[long_item], raw=False))
        expected = models.answers(core, short)
        release()
        baseline = torch.cuda.memory_allocated(self.device)
        low, high = baseline, baseline + (1 << 30)  # the smallest cap at which the long row runs alone
        for _ in range(16):
            middle = (low + high) // 2
            with memory_cap(middle, self.device), contextlib.suppress(torch.OutOfMemoryError):
                [result] = core.predict(long_row)
                if not isinstance(result, RequestError):
                    high = middle
                    continue
            low = middle
        cap = low
        stages = StageTimes()
        errors: list[str] = []
        with capture_warnings(errors), memory_cap(cap, self.device):
            responses = core.answer([Payload(items=[long_item], raw=False), Payload(items=short, raw=False)], stages)
        figures: dict[str, Any] = {"cap_mib": round((cap - baseline) / 2**20, 1), "statuses": [r.status for r in responses]}
        figures.update({"oom_splits": stages.oom_splits, "errors": errors, "long_error": responses[0].body})
        answered = responses[1].status == 200
        if answered:
            figures["short_to_uncapped"] = models.compare(subject.portable, "fp32", responses[1].body["predictions"], expected)
        ok = responses[0].status == 507 and answered and figures["short_to_uncapped"]["within"]
        self.report.say(
            f"\n{name}, its long row under a cap {figures['cap_mib']} MiB above the loaded model (found by search): "
            f"statuses {figures['statuses']} (the long row's request, the short rows'), {stages.oom_splits} splits, "
            f"short rows' answers within the fp32 match of their uncapped ones: "
            f"{'yes' if answered and figures['short_to_uncapped']['within'] else 'NO'}"
        )
        if not ok:
            self.report.fail(f"{name}: a row too large alone did not fail alone: {figures}")
        return figures

    # 3. speed

    def speed(self) -> None:
        report = self.report
        report.say("\n## Rows/s in process, by batch size (decoded rows -> collate, copy, forward, results)\n")
        results = []
        for name, subject in self.subjects.items():
            path = self.files.get((name, "export"))
            if path is None:
                report.skip(f"speed {name}: no .pt2")
                continue
            portable = subject.portable
            core = InferenceCore.load(path.parent, models.settings(name, path.name), self.device)
            decoded = core.decode(Payload(items=subject.items, raw=False))
            decoded = decoded * (max(self.batch_sizes) // len(decoded) + 1)
            random.Random(0).shuffle(decoded)  # every window is a fair sample of the mix of rows
            cases: list[tuple[str, bool, dict[str, Any]]] = [(p, pinned, {}) for p in PRECISIONS for pinned in (True, False)]
            cases += [(p, True, {key: value}) for key, value in portable.speed_options.items() for p in PRECISIONS]
            if self.device.type != "cuda":
                cases = [("fp32", False, {})]
            header = " | ".join(f"{n:,}" for n in self.batch_sizes)
            report.say(f"{name} ({self.device_name()}):\n")
            report.say(f"| precision | pinned + non_blocking | {header} |")
            report.say("| --- | --- | " + " | ".join("---" for _ in self.batch_sizes) + " |")
            for precision, pinned, options in cases:
                set_precision(core, precision)
                core.pinned_copies = pinned
                before = models.task_options(core, options)
                rates = []
                for batch in self.batch_sizes:
                    if self.budget.left() < 60:
                        rates.append(None)
                        continue
                    rates.append(rows_per_second(core, decoded, batch, self.device))
                models.task_options(core, before)
                results.append(
                    {
                        "model": name,
                        "precision": precision,
                        "pinned": pinned,
                        "task_options": options,
                        "rows_per_s": dict(zip(self.batch_sizes, rates, strict=False)),
                    }
                )
                cells = " | ".join("skipped" if r is None else f"{r:,.0f}" for r in rates)
                extra = "".join(f", {key} {value}" for key, value in options.items())
                report.say(f"| {precision}{extra} | {'on' if pinned else 'off'} | {cells} |")
            if self.device.type == "cuda" and self.budget.left() > 60:
                cpu_core = InferenceCore.load(path.parent, models.settings(name, path.name), torch.device("cpu"))
                rates = []
                for batch in self.batch_sizes:
                    if batch > portable.cpu_speed_max_batch:  # tens of seconds a call on the CPU
                        rates.append(None)
                        continue
                    rates.append(
                        rows_per_second(cpu_core, decoded, batch, torch.device("cpu"), seconds=0.3)
                        if self.budget.left() > 60
                        else None
                    )
                results.append(
                    {
                        "model": name,
                        "precision": "fp32",
                        "device": "cpu",
                        "rows_per_s": dict(zip(self.batch_sizes, rates, strict=False)),
                    }
                )
                cells = " | ".join("skipped" if r is None else f"{r:,.0f}" for r in rates)
                report.say(f"| fp32 on this machine's CPU ({torch.get_num_threads()} threads) | - | {cells} |")
            report.say("")
            results.append(self.overlap(name, core, subject.items))
            del core
            release()
        report.data["speed"] = results

    def overlap(self, name: str, core: InferenceCore, items: list[Any]) -> dict[str, Any]:
        """From request items to results: decode then forward, chunk after chunk, against decoding the next chunk
        in a thread while this one runs (a bounded, one-chunk prefetch)."""
        set_precision(core, "fp32")
        core.pinned_copies = True
        chunk = self.subjects[name].portable.overlap_chunk
        chunk, count = (chunk, 16) if self.device.type == "cuda" else (min(chunk, 64), 4)
        chunks = [models.cycled(items, chunk * count)[i * chunk : (i + 1) * chunk] for i in range(count)]

        def serial() -> int:
            return sum(len(core.predict(core.decode(Payload(items=c, raw=False)))) for c in chunks)

        def overlapped() -> int:
            done = 0
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pending = pool.submit(core.decode, Payload(items=chunks[0], raw=False))
                for following in [*chunks[1:], None]:
                    rows = pending.result()
                    if following is not None:
                        pending = pool.submit(core.decode, Payload(items=following, raw=False))
                    done += len(core.predict(rows))
            return done

        core.settings = dataclasses.replace(core.settings, max_batch_rows=chunk)
        figures = {"model": name, "chunk_rows": chunk, "chunks": len(chunks)}
        for label, run in (("serial", serial), ("overlapped", overlapped)):
            run()  # warm
            started = time.perf_counter()
            rows = run()
            figures[f"{label}_rows_per_s"] = rows / (time.perf_counter() - started)
        figures["overlap_gain"] = figures["overlapped_rows_per_s"] / figures["serial_rows_per_s"]
        self.report.say(
            f"{name}, raw items -> results in chunks of {chunk} ({self.device.type}, fp32): decode then forward "
            f"{figures['serial_rows_per_s']:,.0f} rows/s, decode overlapped {figures['overlapped_rows_per_s']:,.0f} rows/s "
            f"({figures['overlap_gain']:.2f}x)\n"
        )
        return figures

    def device_name(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else platform.processor() or "cpu"


def rows_per_second(core: InferenceCore, pool: list[Any], batch: int, device: torch.device, seconds: float = 0.25) -> float:
    """Calls of `batch` rows each (one forward pass), taken in turn from `pool` (the same shuffled mix of rows for
    every batch size), for at least `seconds` after a warm-up call."""
    core.settings = dataclasses.replace(core.settings, max_batch_rows=batch)
    position = 0

    def window() -> list[Any]:
        nonlocal position
        rows = [pool[(position + i) % len(pool)] for i in range(batch)]
        position += batch
        return rows

    core.predict(window())  # warm: kernels chosen, allocator pools filled
    synchronize(device)
    rates = []
    for _ in range(3):  # the median of three windows
        done, started = 0, time.perf_counter()
        while True:
            done += len(core.predict(window()))
            elapsed = time.perf_counter() - started
            if elapsed >= seconds / 3:
                rates.append(done / elapsed)
                break
    return sorted(rates)[1]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


@contextlib.contextmanager
def memory_cap(limit_bytes: int, device: torch.device) -> Iterator[None]:
    """This process's CUDA caching allocator may hold at most `limit_bytes` (a real limit: past it, a real
    torch.OutOfMemoryError is raised by the allocator)."""
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit_bytes / total), device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()


@contextlib.contextmanager
def capture_warnings(into: list[str]) -> Iterator[None]:
    """The core's out-of-memory warnings (which name the error type each loader raised) into `into`."""

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if "out of memory" in message:
                into.append(message.split(":")[0])

    logger = logging.getLogger("handlers.core")
    handler = Collect(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def onnx_providers() -> list[str]:
    try:
        import onnxruntime
    except ImportError:
        return []
    return onnxruntime.get_available_providers()


def environment(device: torch.device) -> dict[str, Any]:
    facts: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        facts.update({"gpu": properties.name, "gpu_memory_gib": round(properties.total_memory / 2**30, 1)})
        facts.update({"cuda": torch.version.cuda, "capability": f"{properties.major}.{properties.minor}"})
    try:
        import onnxruntime

        facts.update({"onnxruntime": onnxruntime.__version__, "onnxruntime_providers": onnxruntime.get_available_providers()})
    except ImportError:
        facts["onnxruntime"] = None
    facts["java"] = shutil.which("java")
    return facts


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=DEFAULT_BUNDLE, help="made by python -m scripts.gpu.bundle")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="gpu-check.json and gpu-check.md go here")
    parser.add_argument("--work", type=Path, help="model files made here (default: <out>/models)")
    parser.add_argument("--budget-s", type=float, default=420, help="stop starting new parts after this many seconds")
    parser.add_argument("--dry-run", action="store_true", help="without CUDA: run what the CPU allows, on the CPU")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=list(BATCH_SIZES))
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=("agreement", "oom", "speed", "aoti"),
        default=["agreement", "oom", "speed"],
        help="run in this order; aoti: AOTInductor agreement alone (for --aoti-models), after the rest",
    )
    names = list(registry.models())
    parser.add_argument("--models", nargs="+", choices=names, default=names, help="default: every model in models/")
    parser.add_argument("--aoti-models", nargs="+", choices=names, help="default: --models")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.dry_run:
        print(
            f"gpu-check needs CUDA, and this machine has none (torch {torch.__version__}, "
            f"torch.cuda.is_available() is False): run it on a machine with an NVIDIA GPU and a CUDA build of torch. "
            f"(--dry-run tries the script on the CPU.)",
            file=sys.stderr,
        )
        return EXIT_NO_CUDA
    if not (args.bundle / "bundle.json").is_file():
        print(f"no bundle at {args.bundle}: make it with `python -m scripts.gpu.bundle` (make gpu-bundle)", file=sys.stderr)
        return 1
    sys.path.insert(0, str(args.bundle / SITE))  # the pure-Python packages a model's eager module imports
    device = torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    started = time.perf_counter()
    report = Report(args.out)
    facts = environment(device)
    facts["bundle"] = json.loads((args.bundle / "bundle.json").read_text())
    report.data["environment"] = facts
    report.say("# GPU check\n")
    report.say("```\n" + json.dumps(facts, indent=1) + "\n```\n")
    check = Check(args.bundle, args.work or args.out / "models", device, Budget(args.budget_s), report, args.models)
    check.formats = tuple(args.formats)
    check.batch_sizes = tuple(args.batch_sizes)
    strays = sorted(set(args.aoti_models or ()) - set(args.models))
    if strays:
        parser.error(f"--aoti-models {' '.join(strays)}: not among --models {' '.join(args.models)}")
    check.aoti_models = tuple(args.aoti_models or args.models)
    parts: dict[str, Callable[[], None]] = {
        "agreement": check.agreement,
        "oom": check.out_of_memory,
        "speed": check.speed,
        "aoti": check.compiled,
    }
    for name in args.parts:
        try:
            parts[name]()
        except Exception as error:  # noqa: BLE001 - one part's crash is reported; the others still run
            report.fail(f"{name} crashed: {type(error).__name__}: {error}\n{traceback.format_exc()[-1500:]}")
    if facts["java"]:
        java = "a Java runtime is here, but this check runs the core in process only: `make gpu-check` runs the lane"
    else:
        java = "no Java runtime here, so no TorchServe frontend: the stream lane was not measured on this GPU"
    report.say(f"\nJava: {java}")
    report.data["seconds"] = round(time.perf_counter() - started, 1)
    report.say(f"\n{len(report.data['failures'])} failures, {len(report.data['skipped'])} skipped, {report.data['seconds']}s")
    report.write()
    return 1 if report.data["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
