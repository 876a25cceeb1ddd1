"""One exported model in any serving format, from the eager module and its torch.export program.

| format        | file                         | precisions it can carry                          |
| ------------- | ---------------------------- | ------------------------------------------------ |
| `export`      | `<stem>.pt2`                 | fp32; bf16 / fp16 by the handler's autocast        |
| `torchscript` | `<stem>.ts`                  | fp32; bf16 / fp16 by autocast                     |
| `aoti`        | `<stem>.aoti.pt2`            | fp32; bf16 compiled in (`<stem>.bf16.aoti.pt2`) |
| `onnx`        | `<stem>.onnx`                | fp32; int8 (onnxruntime quantize_dynamic, `<stem>.int8.onnx`) |

Compiled formats (aoti, onnx) cannot be reached by autocast, so a precision other than fp32 is built
into the file and its name says so; for export / torchscript the file is fp32 and the handler applies
bf16 / fp16 at run time. Every file keeps the program's dynamic axes (batch; sequence for minilm) and
none is a pickle. Building needs what the handler does not: onnx, onnxscript (and onnxruntime for int8).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scripts.errors import ArchiveError

FORMATS = ("export", "torchscript", "aoti", "onnx")
DEFAULT_FORMAT = "export"
SUFFIXES = {"export": ".pt2", "torchscript": ".ts", "aoti": ".aoti.pt2", "onnx": ".onnx"}
# Precisions each format supports; "runtime" ones are applied by the handler (autocast), the others are
# built into the file.
RUNTIME_PRECISIONS = {"export": ("fp32", "bf16", "fp16"), "torchscript": ("fp32", "bf16", "fp16")}
BUILT_PRECISIONS = {"aoti": ("bf16",), "onnx": ("int8",)}
# int8 is ONNX only: torch's dynamic quantization (per-tensor nn.Linear) gave minilm a worst cosine of
# 0.75 to fp32 on the varied test sentences, onnxruntime's per-channel MatMul quantization 0.96.


def supported(fmt: str) -> tuple[str, ...]:
    return ("fp32",) + tuple(p for p in RUNTIME_PRECISIONS.get(fmt, ()) if p != "fp32") + BUILT_PRECISIONS.get(fmt, ())


def check(fmt: str, precision: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if precision not in supported(fmt):
        raise ValueError(f"format {fmt} cannot run at precision {precision}; it supports {', '.join(supported(fmt))}")


def file_name(stem: str, fmt: str, precision: str = "fp32") -> str:
    """digits.onnx, minilm.int8.onnx, digits.bf16.aoti.pt2, minilm.pt2 (bf16 at run time: same file as fp32)."""
    check(fmt, precision)
    built = precision in BUILT_PRECISIONS.get(fmt, ())
    return f"{stem}.{precision}{SUFFIXES[fmt]}" if built else f"{stem}{SUFFIXES[fmt]}"


def write(
    fmt: str,
    precision: str,
    eager: nn.Module,
    program_path: Path,
    example: tuple[torch.Tensor, ...],
    dynamic_shapes: Sequence[dict[int, Any]],
    names: tuple[Sequence[str], str],
    out: Path,
) -> Path:
    """Write `eager` (whose torch.export program is at `program_path`) as `out` in `fmt` at `precision`.

    Written to a temporary name and renamed, so an interrupted build never leaves a file that looks built."""
    check(fmt, precision)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as staging:
        partial = Path(staging) / out.name
        if fmt == "export":
            shutil.copy2(program_path, partial)
        elif fmt == "torchscript":
            _torchscript(eager, example, precision, partial)
        elif fmt == "aoti":
            _aoti(eager, program_path, example, dynamic_shapes, precision, partial)
        else:
            _onnx(program_path, names, precision, partial)
        os.replace(partial, out)
    return out


def _torchscript(eager: nn.Module, example, precision: str, path: Path) -> None:
    with torch.no_grad(), strict_fp32():
        # Tracing records the tensor ops, with sizes read from the inputs (aten::size), so batch and
        # sequence stay dynamic; verify() checks that at other shapes than the example's.
        traced = torch.jit.trace(eager, example, check_trace=False)
    torch.jit.save(traced, str(path))


@contextlib.contextmanager
def strict_fp32():
    """Trace with cuDNN's TF32 off: a trace writes the flag into each convolution (aten::_convolution's allow_tf32),
    and the CUDA default (on) moved digits' probabilities by 3e-4 from the CPU's on an H200 (docs/gpu.md)."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = saved


def _aoti(eager, program_path, example, dynamic_shapes, precision, path: Path) -> None:
    if precision == "bf16":
        # Autocast cannot reach compiled kernels, so it is traced into the graph (an autocast region inside
        # forward; one around the export call would be ignored) and compiled.
        with torch.no_grad():
            # forward(*inputs): one positional varargs entry holding every input's axes.
            program = torch.export.export(_Bf16(eager), example, dynamic_shapes=(tuple(dynamic_shapes),))
    else:
        program = torch.export.load(str(program_path))
    # The package holds a compiled shared library for this machine's CPU (the C++ compiler is needed here).
    torch._inductor.aoti_compile_and_package(program, package_path=str(path))


class _Bf16(nn.Module):
    """The wrapped model under CPU bf16 autocast, with a float32 output as every other file gives."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *inputs):
        # The inputs' device at export (CPU for make archive): autocast "cpu" alone would leave a program
        # exported on CUDA in fp32.
        with torch.autocast(inputs[0].device.type, dtype=torch.bfloat16):
            output = self.inner(*inputs)
        return output.float()


def _onnx(program_path: Path, names: tuple[Sequence[str], str], precision: str, path: Path) -> None:
    input_names, output_name = names
    # From the torch.export program itself: its dynamic axes become the ONNX graph's symbolic dims.
    program = torch.export.load(str(program_path))
    with contextlib.redirect_stdout(open(os.devnull, "w")):
        onnx_program = torch.onnx.export(
            program, input_names=list(input_names), output_names=[output_name], dynamo=True, optimize=True
        )
    fp32 = path if precision == "fp32" else path.with_name(path.name + ".fp32.onnx")
    onnx_program.save(str(fp32), external_data=False)
    if precision == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        # Only MatMuls with a weight operand; attention's activation x activation MatMuls stay float.
        quantize_dynamic(str(fp32), str(path), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"], per_channel=True)
        fp32.unlink()


def verify(
    load: Callable[[Path], Callable[..., torch.Tensor]],
    path: Path,
    eager: nn.Module,
    cases: Sequence[tuple[torch.Tensor, ...]],
    compare: Callable[[torch.Tensor, torch.Tensor], float],
    limit: float,
) -> float:
    """The written file against the eager model at shapes other than the example's (the dynamic axes'
    edges); removes the file and fails when the worst `compare` exceeds `limit`."""
    model = load(path)
    worst = 0.0
    with torch.inference_mode():
        for inputs in cases:
            worst = max(worst, compare(model(*inputs).float(), eager(*inputs).float()))
    if worst > limit:
        path.unlink()
        raise ArchiveError(f"{path.name} differs from the eager model: {worst:.3g} > {limit:g}")
    return worst


def convert_command(doc: str | None, program_help: str, convert: Callable[[Path, str, str], Path]) -> int:
    """The command line of models/<name>/formats.py: --program, --format, --precision -> convert()."""
    from scripts import cli

    parser = cli.parser_for(doc)
    parser.add_argument("--program", type=Path, required=True, help=program_help)
    parser.add_argument("--format", choices=FORMATS, required=True)
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args()
    started = time.perf_counter()
    try:
        convert(args.program, args.format, args.precision)
    except ValueError as error:  # an unknown format, or a precision the format cannot carry
        raise ArchiveError(str(error)) from None
    print(f"converted in {time.perf_counter() - started:.1f}s")
    return 0


def stale(file: Path, sources: list[Path]) -> bool:
    """Missing, or older than what it is made from (so a changed export is not served from an old build)."""
    return not file.exists() or any(file.stat().st_mtime < source.stat().st_mtime for source in sources)
