"""Every model rebuilt where the check runs, from what its folder declares (models/portable.py): eager modules from
plain weights, every serving format exported by that machine's torch (for CUDA where it has one), cores around them
with the model's own handler settings, and answers compared as the model says. Needs torch, numpy and what each
model's `eager` imports: never the weights' wheels, TorchServe or the network."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from handlers.core import InferenceCore
from handlers.decoding import Payload
from handlers.settings import HandlerSettings
from handlers.tasks import build_task
from models import export_formats, registry
from models.portable import Portable

SUFFIXES = export_formats.SUFFIXES
CAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def settings(name: str, model_file: str, **changes: Any) -> HandlerSettings:
    """The model's handler settings as its bulk lane (or its stream lane, without one) reads them, with `model_file`,
    torch's own threads and `changes` in place of the folder's values."""
    found = registry.model(name)
    lane = (found.bulk_lane or found.stream_lane).name
    handler = {**found.handler_config()["handler"], "model_file": model_file, "torch_threads": None, **changes}
    return HandlerSettings.from_yaml({"handler": handler}, lane)


def eager_core(eager: torch.nn.Module, settings: HandlerSettings, folder: Path, device: torch.device) -> InferenceCore:
    """A core around an eager module (the reference), with the task's files loaded from `folder`."""
    task = build_task(settings)
    task.load_files(folder)
    return InferenceCore(task, eager.to(device), device, settings)


def answers(core: InferenceCore, items: Sequence[Any]) -> list[Any]:
    """The core's predictions for `items` in one request; a non-200 answer stops the check with its body."""
    [response] = core.answer([Payload(items=list(items), raw=False)])
    if response.status != 200:
        raise RuntimeError(f"answered {response.status}: {str(response.body)[:300]}")
    return response.body["predictions"]


def compare(portable: Portable, precision: str, served: Sequence[Any], reference: Sequence[Any]) -> dict[str, Any]:
    """Served predictions against the reference's, row by row, by the model's match for `precision`: the rows
    outside it, the first such row's difference, and the largest difference of any two values at the same place (an
    integer label counts as a number, a named one as inf where it differs). Within: no row outside, or at most the
    share the match's min_agreement leaves; never when the row counts differ."""
    declared = dict(portable.agreement[precision])
    least = float(declared.pop("min_agreement", 1.0))
    match = registry.Samples(portable.name, (), (), declared, least)
    if len(served) != len(reference):
        return {"rows": len(reference), "rows_outside": len(reference), "largest_difference": math.inf, "within": False,
                "first_outside": f"{len(served)} answers for {len(reference)} rows"}  # fmt: skip
    problems = [match.problem(a, b) for a, b in zip(served, reference, strict=True)]
    outside = [(row, problem) for row, problem in enumerate(problems) if problem]
    largest = max((registry.largest_difference(a, b) for a, b in zip(served, reference, strict=True)), default=0.0)
    figures: dict[str, Any] = {"rows": len(problems), "rows_outside": len(outside), "largest_difference": largest}
    if outside:
        figures["first_outside"] = f"row {outside[0][0]}: {outside[0][1]}"
    figures["within"] = len(problems) - len(outside) >= least * len(problems)
    return figures


def cycled(values: Sequence[Any], rows: int) -> list[Any]:
    return [values[i % len(values)] for i in range(rows)]


def write_format(
    portable: Portable, eager: torch.nn.Module, fmt: str, folder: Path, device: torch.device, precision: str = "fp32"
) -> tuple[Path, float]:
    """Export `eager` as `fmt` into `folder` with this torch. AOTInductor compiles for `device`, and TorchScript is
    traced there (a trace keeps the devices its graph creates tensors on). A half `precision` casts the weights
    (and the example's float inputs) once before exporting, into <stem>.<precision><suffix>: the program the
    handler runs with cast_weights, without autocast. (path, seconds)."""
    started = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    infix = f".{precision}" if precision in CAST_DTYPES else ""
    path = folder / f"{portable.stem}{infix}{SUFFIXES[fmt]}"
    # TorchScript is traced where it will run; torch.export runs on the CPU (exporting minilm on CUDA adds a guard
    # on the sequence length from the attention kernel's alignment that the dynamic axis violates), and for
    # AOTInductor the CPU program is moved to the device before it is compiled there.
    trace_device = device if fmt == "torchscript" else torch.device("cpu")
    dtype = CAST_DTYPES.get(precision)
    module = eager.to(trace_device) if dtype is None else eager.to(trace_device, dtype)
    inputs, axes = portable.example(trace_device)
    if dtype is not None:
        inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    with torch.no_grad(), export_formats.strict_fp32():
        if fmt == "torchscript":
            torch.jit.save(torch.jit.trace(module, inputs, check_trace=False), str(path))
        else:
            program = torch.export.export(module, inputs, dynamic_shapes=tuple(axes))
            if fmt == "export":
                torch.export.save(program, str(path))
            elif fmt == "aoti":
                if device.type != "cpu":
                    from torch.export.passes import move_to_device_pass

                    program = move_to_device_pass(program, device)
                torch._inductor.aoti_compile_and_package(program, package_path=str(path))
            else:
                onnx_program = torch.onnx.export(
                    program,
                    input_names=list(portable.input_names),
                    output_names=[portable.output_name],
                    dynamo=True,
                    optimize=True,
                )
                onnx_program.save(str(path), external_data=False)
    eager.to("cpu", torch.float32)
    return path, time.perf_counter() - started


def task_options(core: InferenceCore, options: Mapping[str, Any]) -> dict[str, Any]:
    """Set task attributes (a model's speed_options) on a loaded core; returns the values they had."""
    before = {name: getattr(core.task, name) for name in options}
    for name, value in options.items():
        setattr(core.task, name, value)
    return before
