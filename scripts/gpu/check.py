"""The CUDA path, checked on a real GPU: agreement with the CPU, out-of-memory survived, rows/s by batch size.

    python -m scripts.gpu.bundle                        # here: the models, inputs and CPU answers (build/gpu-bundle)
    python -m scripts.gpu.check [--out build/gpu-check] # there: needs CUDA, torch, numpy, tokenizers, transformers

`make gpu-check` runs both, then the tests marked gpu. Without CUDA it stops at once with status 2 and says so
(`--dry-run` runs what the CPU allows, on the CPU, to try the script itself). Everything is printed and written
to <out>/gpu-check.json and <out>/gpu-check.md (the tables of docs/benchmarks.md's GPU section):

1. agreement: digits (360 held-out rows) and minilm (240 varied sentences) through the handler's core on CUDA
   against the CPU, for every format this torch loads (a file made by another torch that does not load is
   re-exported here, and the report says so), in fp32 and, where autocast reaches, bf16 and fp16;
2. out of memory: a per-process memory cap (torch.cuda.set_per_process_memory_fraction) sized from a measured
   forward pass, so a 65,536-row micro-batch (the export's own maximum) really runs out of device memory and
   must be split; per loader. Then minilm under a cap found by search where one long text does not fit even
   alone: its request fails (507), the request batched with it is answered;
3. speed: in-process rows/s by batch size (1 to 4,096), fp32/bf16/fp16, pinned non-blocking copies on and off,
   and decode overlapped with the forward pass (a one-chunk prefetch) against decode-then-forward.

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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from handlers.core import InferenceCore, StageTimes
from handlers.decoding import Payload
from handlers.errors import RequestError
from scripts.gpu import models
from scripts.layout import BUILD

DEFAULT_BUNDLE = BUILD / "gpu-bundle"  # python -m scripts.gpu.bundle writes it there
DEFAULT_OUT = BUILD / "gpu-check"
EXIT_NO_CUDA = 2
FORMATS = ("export", "torchscript", "onnx", "aoti")
AUTOCAST_FORMATS = ("export", "torchscript")
# Agreement bounds, to the CPU's answers on the same weights. fp32 as the GPU check's goal; bf16 as the CPU's
# format tests hold it (docs/formats.md); fp16 (CUDA only) between the two.
BOUNDS = {
    "fp32": {"digits_max_abs": 1e-4, "cosine": 0.9999},
    "bf16": {"digits_max_abs": 2e-2, "cosine": 0.99},
    "fp16": {"digits_max_abs": 1e-2, "cosine": 0.999},
}
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


# -- answers ------------------------------------------------------------------------------------------


def digits_answers(core: InferenceCore, grids: np.ndarray) -> np.ndarray:
    [response] = core.answer([Payload(items=[g.tolist() for g in grids], raw=False)])
    if response.status != 200:
        raise RuntimeError(f"digits answered {response.status}: {response.body}")
    return np.array([row["scores"] for row in response.body["predictions"]], dtype=np.float64)


def minilm_answers(core: InferenceCore, sentences: list[str]) -> np.ndarray:
    [response] = core.answer([Payload(items=sentences, raw=False)])
    if response.status != 200:
        raise RuntimeError(f"minilm answered {response.status}: {response.body}")
    return np.array([row["embedding"] for row in response.body["predictions"]], dtype=np.float64)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def compare(model: str, served: np.ndarray, reference: np.ndarray) -> dict[str, Any]:
    figures: dict[str, Any] = {"min_cosine": float(cosines(served, reference).min())}
    if model == "digits":
        figures["label_mismatches"] = int((served.argmax(1) != reference.argmax(1)).sum())
        figures["max_abs"] = float(np.abs(served - reference).max())
    return figures


def within(model: str, precision: str, figures: dict[str, Any]) -> bool:
    bound = BOUNDS[precision]
    if model == "digits":
        return figures["label_mismatches"] == 0 and figures["max_abs"] <= bound["digits_max_abs"]
    return figures["min_cosine"] >= bound["cosine"]


def set_precision(core: InferenceCore, precision: str) -> None:
    """Switch a loaded core's precision (autocast is decided at load from the settings)."""
    core.settings = dataclasses.replace(core.settings, precision=precision)
    core.autocast_dtype = core._autocast_dtype()


# -- the check's parts ----------------------------------------------------------------------------------


class Check:
    def __init__(self, bundle: Path, work: Path, device: torch.device, budget: Budget, report: Report) -> None:
        self.bundle = bundle
        self.device = device
        self.budget = budget
        self.report = report
        self.work = work
        if self.work.exists():
            shutil.rmtree(self.work)
        self.work.mkdir(parents=True)
        with np.load(bundle / "digits_inputs.npz", allow_pickle=False) as inputs:
            self.grids = inputs["grids"]
            self.labels = inputs["labels"]
        with np.load(bundle / "digits_reference.npz", allow_pickle=False) as reference:
            self.digits_reference = reference["probabilities"].astype(np.float64)
        minilm_inputs = json.loads((bundle / "minilm_inputs.json").read_text())
        self.sentences: list[str] = minilm_inputs["sentences"]
        self.max_seq_length: int = minilm_inputs["max_seq_length"]
        with np.load(bundle / "minilm_reference.npz", allow_pickle=False) as reference:
            self.minilm_reference = reference["embeddings"].astype(np.float64)
        self.digits_eager = models.digits_eager(bundle / "digits")
        self.encoder = models.rounded_encoder(bundle / "minilm")
        self.formats = FORMATS
        self.aoti_models: tuple[str, ...] = ("digits", "minilm")
        self.reserve_s = 120.0
        self.batch_sizes = BATCH_SIZES
        self.files: dict[tuple[str, str], Path] = {}
        self.cpu_answers: dict[str, np.ndarray] = {}

    def settings(self, model: str, model_file: str, **changes: Any):
        if model == "digits":
            return models.digits_settings(model_file, **changes)
        return models.minilm_settings(model_file, self.max_seq_length, **changes)

    def folder(self, model: str) -> Path:
        folder = self.work / model
        if not folder.exists():
            folder.mkdir(parents=True)
            if model == "minilm":
                shutil.copy2(self.bundle / "minilm" / "tokenizer.json", folder)
        return folder

    def answers(self, model: str, core: InferenceCore) -> np.ndarray:
        return digits_answers(core, self.grids) if model == "digits" else minilm_answers(core, self.sentences)

    # 1. agreement

    def model_file(self, model: str, fmt: str) -> tuple[Path | None, str]:
        """The format's file for this machine: the bundle's where it loads, else exported here. (path, how)."""
        folder = self.folder(model)
        made_elsewhere = self.bundle / model / f"{model}{models.SUFFIXES[fmt]}"
        if made_elsewhere.is_file():
            try:
                InferenceCore.load(self.bundle / model, self.settings(model, made_elsewhere.name), self.device)
                shutil.copy2(made_elsewhere, folder)
                return folder / made_elsewhere.name, "file made by the bundle's torch loads"
            except Exception as error:  # noqa: BLE001 - recorded, then the file is made here instead
                note = f"bundle's file does not load here ({type(error).__name__}: {str(error)[:160]}); re-exported"
        else:
            note = {"aoti": f"compiled here for {self.device.type}", "torchscript": f"traced here on {self.device.type}"}
            note = note.get(fmt, "exported here")
            if fmt == "torchscript" and self.device.type == "cuda":
                note += f"; {self.cpu_traced_on_cuda(model)}"
        eager = self.digits_eager if model == "digits" else self.encoder
        try:
            path, seconds = models.write_format(model, eager, fmt, folder, self.device)
        except Exception as error:  # noqa: BLE001 - a format this torch cannot write is a finding, not a crash
            return None, f"cannot be made here: {type(error).__name__}: {str(error)[:300]}"
        return path, f"{note} ({seconds:.0f}s)"

    def cpu_traced_on_cuda(self, model: str) -> str:
        """What a TorchScript file traced on the CPU (as make archive traces it) does on this GPU."""
        eager = self.digits_eager if model == "digits" else self.encoder
        path, _ = models.write_format(model, eager, "torchscript", self.work / "cpu-traced", torch.device("cpu"))
        if model == "minilm":
            shutil.copy2(self.bundle / "minilm" / "tokenizer.json", path.parent)
        try:
            core = InferenceCore.load(path.parent, self.settings(model, path.name), self.device)
            self.answers(model, core)
        except Exception as error:  # noqa: BLE001 - the finding
            return f"a CPU-traced file here: {type(error).__name__}: {str(error)[:220]}"
        return "a CPU-traced file runs here too"

    def compiled(self) -> None:
        """AOTInductor, last: compiling minilm takes minutes, so it runs once the rest is in."""
        self.formats, self.reserve_s = ("aoti",), 0.0
        self.agreement(self.aoti_models)

    def agreement(self, model_names: tuple[str, ...] = ("digits", "minilm")) -> None:
        report = self.report
        report.say("## Agreement: CUDA against the CPU, same weights\n")
        report.say(
            "| model | format | precision | file | label mismatches | min cosine to CPU here | "
            "min cosine to bundle's CPU | max abs | within bounds |"
        )
        report.say("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        results = []
        for model in model_names:
            cpu_core = models.eager_core(
                self.digits_eager if model == "digits" else self.encoder,
                self.settings(model, f"{model}.pt2"),
                self.folder(model),
                torch.device("cpu"),
            )
            cpu = self.answers(model, cpu_core)
            self.cpu_answers[model] = cpu
            bundle_reference = self.digits_reference if model == "digits" else self.minilm_reference
            for fmt in self.formats:
                # Seconds a file takes to make there (AOTInductor compiles minilm for minutes), plus what the
                # out-of-memory and speed parts need after it.
                needed = {"aoti": 90 if model == "digits" else 180}.get(fmt, 20)
                if self.budget.left() < needed + self.reserve_s:
                    report.skip(f"agreement {model}/{fmt}: time budget")
                    continue
                if fmt == "onnx" and self.device.type == "cuda" and "CUDAExecutionProvider" not in onnx_providers():
                    how = f"not run: this onnxruntime has no CUDAExecutionProvider ({', '.join(onnx_providers()) or 'none'})"
                    report.say(f"| {model} | {fmt} | - | {how} | | | | | not run |")
                    results.append({"model": model, "format": fmt, "file": how, "loaded": False})
                    self.files[(model, fmt)] = None
                    continue
                path, how = self.model_file(model, fmt)
                self.files[(model, fmt)] = path
                if path is None:
                    report.say(f"| {model} | {fmt} | - | {how} | | | | | no file |")
                    results.append({"model": model, "format": fmt, "file": how, "loaded": False})
                    continue
                try:
                    core = InferenceCore.load(path.parent, self.settings(model, path.name), self.device)
                except Exception as error:  # noqa: BLE001
                    note = f"{type(error).__name__}: {str(error)[:200]}"
                    report.say(f"| {model} | {fmt} | - | does not load on {self.device}: {note} | | | | | not run |")
                    results.append({"model": model, "format": fmt, "file": how, "loaded": False, "error": note})
                    continue
                for precision in PRECISIONS if fmt in AUTOCAST_FORMATS else ("fp32",):
                    if precision == "fp16" and self.device.type != "cuda":
                        continue
                    set_precision(core, precision)
                    served = self.answers(model, core)
                    here = compare(model, served, cpu)
                    there = compare(model, served, bundle_reference)
                    ok = within(model, precision, here)
                    row = {"model": model, "format": fmt, "precision": precision, "file": how, "to_cpu": here}
                    row.update({"to_bundle_cpu": there, "within_bounds": ok})
                    results.append(row)
                    report.say(
                        f"| {model} | {fmt} | {precision} | {how} | {here.get('label_mismatches', '-')} | "
                        f"{here['min_cosine']:.6f} | {there['min_cosine']:.6f} | {here.get('max_abs', float('nan')):.1e} | "
                        f"{'yes' if ok else 'NO'} |"
                    )
                    if not ok:
                        report.fail(f"{model}/{fmt}/{precision} outside its bounds: {here}")
                del core
                release()
        self.report.data.setdefault("agreement", []).extend(results)
        if self.device.type == "cuda" and "digits" in self.cpu_answers:
            accuracy = float((self.cpu_answers["digits"].argmax(1) == self.labels).mean())
            report.say(f"\ndigits accuracy on the held-out rows (CPU): {accuracy:.4f}")

    # 2. out of memory

    def out_of_memory(self) -> None:
        report = self.report
        report.say("\n## Out of device memory, survived\n")
        if self.device.type != "cuda":
            report.skip("out-of-memory checks: they need CUDA")
            return
        results = []
        report.say("| loader | rows in the request | memory cap | splits | forward passes (rows) | errors seen | answers = CPU |")
        report.say("| --- | --- | --- | --- | --- | --- | --- |")
        for fmt in self.formats:
            path = self.files.get(("digits", fmt))
            if path is None:
                report.skip(f"out-of-memory with {fmt}: no file (see agreement)")
                continue
            if self.budget.left() < 60:
                report.skip(f"out-of-memory with {fmt}: time budget")
                continue
            try:
                results.append(self.digits_oom(fmt, path))
            except Exception as error:  # noqa: BLE001 - a loader whose OOM is not survived is the finding
                report.fail(f"out-of-memory with {fmt}: {type(error).__name__}: {str(error)[:400]}")
                results.append({"format": fmt, "error": f"{type(error).__name__}: {str(error)[:400]}"})
            release()
        self.report.data["oom"] = results
        if self.budget.left() < 45:
            report.skip("a row too large alone: time budget")
            return
        try:
            self.report.data["oom_alone"] = self.row_too_large_alone()
        except Exception as error:  # noqa: BLE001
            report.fail(f"a row too large alone: {type(error).__name__}: {str(error)[:400]}\n{traceback.format_exc()[-800:]}")
        release()

    def digits_oom(self, fmt: str, path: Path) -> dict[str, Any]:
        rows = models.DIGITS_MAX_BATCH
        settings = self.settings("digits", path.name, max_batch_rows=rows)
        core = InferenceCore.load(path.parent, settings, self.device)
        grids = np.resize(self.grids, (rows, 8, 8))
        # The memory one 8,192-row forward pass needs, measured: the cap leaves room for 2x that, so 16,384
        # rows fit and the 65,536-row micro-batch (8x) cannot.
        probe = grids[:8192]
        digits_answers(core, probe)
        release()
        baseline = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        digits_answers(core, probe)
        peak = torch.cuda.max_memory_allocated(self.device) - baseline
        cap = baseline + 2 * peak + (64 << 20)
        errors: list[str] = []
        stages = StageTimes()
        with capture_warnings(errors), memory_cap(cap, self.device):
            responses = core.answer(
                [Payload(items=[g.tolist() for g in grids], raw=False), Payload(items=[self.grids[0].tolist()], raw=False)],
                stages,
            )
        statuses = [r.status for r in responses]
        served = np.array([row["scores"] for row in responses[0].body["predictions"]]) if statuses[0] == 200 else None
        cpu = self.cpu_full_digits(grids)
        figures = {"format": fmt, "rows": rows, "cap_mib": cap >> 20, "peak_8192_mib": peak >> 20, "statuses": statuses}
        figures.update({"oom_splits": stages.oom_splits, "forward_rows": sorted(set(stages.forward_rows)), "errors": errors})
        agree = served is not None and compare("digits", served, cpu)["label_mismatches"] == 0
        figures["answers_equal_cpu"] = agree and compare("digits", served, cpu)["max_abs"] <= 1e-4
        if served is not None:
            figures["max_abs_to_cpu"] = compare("digits", served, cpu)["max_abs"]
        self.report.say(
            f"| {fmt} | {rows:,} (+1) | {cap >> 20} MiB | {stages.oom_splits} | {len(stages.forward_rows)} "
            f"({', '.join(f'{n:,}' for n in sorted(set(stages.forward_rows)))}) | {'; '.join(sorted(set(errors)))[:160]} | "
            f"{'yes' if figures['answers_equal_cpu'] else 'NO'} |"
        )
        if statuses != [200, 200] or stages.oom_splits < 1 or not figures["answers_equal_cpu"]:
            self.report.fail(f"out-of-memory with {fmt} not survived by splitting: {figures}")
        return figures

    def cpu_full_digits(self, grids: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.digits_eager(torch.from_numpy(grids).float().unsqueeze(1)).double().numpy()

    def row_too_large_alone(self) -> dict[str, Any]:
        """minilm: under a cap where one 256-token text cannot run even alone, its request gets a 507 and the
        request of short texts batched with it is answered as without a cap."""
        path = self.files.get(("minilm", "export"))
        if path is None:
            raise RuntimeError("no minilm.pt2 (see agreement)")
        core = InferenceCore.load(path.parent, self.settings("minilm", path.name), self.device)
        long_text = "word " * 400
        short = ["a short one", "Paris is in France.", "the cat sat on the mat"]
        long_row = core.decode(Payload(items=[long_text], raw=False))
        expected = minilm_answers(core, short)
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
            responses = core.answer([Payload(items=[long_text], raw=False), Payload(items=short, raw=False)], stages)
        figures: dict[str, Any] = {"cap_mib": round((cap - baseline) / 2**20, 1), "statuses": [r.status for r in responses]}
        figures.update({"oom_splits": stages.oom_splits, "errors": errors, "long_error": responses[0].body})
        answered = responses[1].status == 200
        if answered:
            served = np.array([row["embedding"] for row in responses[1].body["predictions"]])
            figures["short_min_cosine_to_uncapped"] = float(cosines(served, expected).min())
        ok = responses[0].status == 507 and answered and figures.get("short_min_cosine_to_uncapped", 0) >= 0.9999
        self.report.say(
            f"\nminilm, a 256-token text under a cap {figures['cap_mib']} MiB above the loaded model (found by search): "
            f"statuses {figures['statuses']} (the long text's request, the short texts'), {stages.oom_splits} splits, "
            f"short texts' min cosine to their uncapped answers {figures.get('short_min_cosine_to_uncapped', float('nan')):.6f}"
        )
        if not ok:
            self.report.fail(f"a row too large alone did not fail alone: {figures}")
        return figures

    # 3. speed

    def speed(self) -> None:
        report = self.report
        report.say("\n## Rows/s in process, by batch size (decoded rows -> collate, copy, forward, results)\n")
        results = []
        for model in ("digits", "minilm"):
            path = self.files.get((model, "export"))
            if path is None:
                report.skip(f"speed {model}: no .pt2")
                continue
            core = InferenceCore.load(path.parent, self.settings(model, path.name), self.device)
            items: list[Any] = [g.tolist() for g in self.grids] if model == "digits" else list(self.sentences)
            decoded = core.decode(Payload(items=items, raw=False))
            decoded = decoded * (4096 // len(decoded) + 1)
            random.Random(0).shuffle(decoded)  # every window is a fair sample of the mix of rows
            cases = [(p, pinned, 1) for p in PRECISIONS for pinned in (True, False)]
            if model == "minilm":  # sequence lengths rounded up to multiples of 32 (handler.pad_to_multiple)
                cases += [(p, True, 32) for p in PRECISIONS]
            if self.device.type != "cuda":
                cases = [("fp32", False, 1)]
            header = " | ".join(f"{n:,}" for n in self.batch_sizes)
            report.say(f"{model} ({self.device_name()}):\n")
            report.say(f"| precision | pinned + non_blocking | {header} |")
            report.say("| --- | --- | " + " | ".join("---" for _ in self.batch_sizes) + " |")
            for precision, pinned, multiple in cases:
                set_precision(core, precision)
                core.pinned_copies = pinned
                if model == "minilm":
                    core.task.pad_to_multiple = multiple
                rates = []
                for batch in self.batch_sizes:
                    if self.budget.left() < 60:
                        rates.append(None)
                        continue
                    rates.append(rows_per_second(core, decoded, batch, self.device))
                results.append(
                    {
                        "model": model,
                        "precision": precision,
                        "pinned": pinned,
                        "pad_to_multiple": multiple,
                        "rows_per_s": dict(zip(self.batch_sizes, rates, strict=False)),
                    }
                )
                cells = " | ".join("skipped" if r is None else f"{r:,.0f}" for r in rates)
                padded = f", lengths to x{multiple}" if multiple > 1 else ""
                report.say(f"| {precision}{padded} | {'on' if pinned else 'off'} | {cells} |")
            if self.device.type == "cuda" and self.budget.left() > 60:
                cpu_core = InferenceCore.load(path.parent, self.settings(model, path.name), torch.device("cpu"))
                rates = []
                for batch in self.batch_sizes:
                    if model == "minilm" and batch > 512:  # tens of seconds a call on the CPU
                        rates.append(None)
                        continue
                    rates.append(
                        rows_per_second(cpu_core, decoded, batch, torch.device("cpu"), seconds=0.3)
                        if self.budget.left() > 60
                        else None
                    )
                results.append(
                    {
                        "model": model,
                        "precision": "fp32",
                        "device": "cpu",
                        "rows_per_s": dict(zip(self.batch_sizes, rates, strict=False)),
                    }
                )
                cells = " | ".join("skipped" if r is None else f"{r:,.0f}" for r in rates)
                report.say(f"| fp32 on this machine's CPU ({torch.get_num_threads()} threads) | - | {cells} |")
            report.say("")
            results.append(self.overlap(model, core, items))
            del core
            release()
        report.data["speed"] = results

    def overlap(self, model: str, core: InferenceCore, items: list[Any]) -> dict[str, Any]:
        """From request items to results: decode then forward, chunk after chunk, against decoding the next chunk
        in a thread while this one runs (a bounded, one-chunk prefetch)."""
        set_precision(core, "fp32")
        core.pinned_copies = True
        if model == "minilm":
            core.task.pad_to_multiple = 1
        chunk, count = (512, 16) if self.device.type == "cuda" else (64, 4)
        chunks = [(items * (chunk * count // len(items) + 1))[i * chunk : (i + 1) * chunk] for i in range(count)]

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
        figures = {"model": model, "chunk_rows": chunk, "chunks": len(chunks)}
        for name, run in (("serial", serial), ("overlapped", overlapped)):
            run()  # warm
            started = time.perf_counter()
            rows = run()
            figures[f"{name}_rows_per_s"] = rows / (time.perf_counter() - started)
        figures["overlap_gain"] = figures["overlapped_rows_per_s"] / figures["serial_rows_per_s"]
        self.report.say(
            f"{model}, raw items -> results in chunks of {chunk} ({self.device.type}, fp32): decode then forward "
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
    parser.add_argument("--aoti-models", nargs="+", choices=("digits", "minilm"), default=["digits", "minilm"])
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
    device = torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    started = time.perf_counter()
    report = Report(args.out)
    facts = environment(device)
    facts["bundle"] = json.loads((args.bundle / "bundle.json").read_text())
    report.data["environment"] = facts
    report.say("# GPU check\n")
    report.say("```\n" + json.dumps(facts, indent=1) + "\n```\n")
    check = Check(args.bundle, args.work or args.out / "models", device, Budget(args.budget_s), report)
    check.formats = tuple(args.formats)
    check.batch_sizes = tuple(args.batch_sizes)
    check.aoti_models = tuple(args.aoti_models)
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
