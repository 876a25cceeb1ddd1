"""Loading exported models without pickle; the loader is chosen by the model file's suffix.

| suffix        | format                                   | runs on                                   |
| ------------- | ---------------------------------------- | ----------------------------------------- |
| `.aoti.pt2`   | AOTInductor package (compiled .so inside) | the device it was compiled for (CPU here) |
| `.pt2`        | torch.export program (graph JSON + raw tensors) | any device (moved whole); called flat |
| `.pt`, `.ts`  | TorchScript                              | any device (map_location)                 |
| `.onnx`       | ONNX, run by onnxruntime                 | CPUExecutionProvider; CUDAExecutionProvider on cuda |

Every loader returns a callable taking and returning torch tensors on `device`, so tasks do not care.
Precision: `.pt2` and `.ts` run under the core's autocast (handler.precision); AOTInductor and ONNX
files are compiled graphs that autocast cannot reach, so their precision is baked in when they are
built (e.g. `minilm.int8.onnx`), see `compiled_precision`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.export.passes import move_to_device_pass

from handlers.op_yield import add_points
from handlers.pickle_guard import refuse_pickles

AOTI_SUFFIX = ".aoti.pt2"
# A file built at another precision says so in its name: minilm.int8.onnx, digits.bf16.aoti.pt2.
# A traced graph that names the CPU as a device (e.g. transformers' attention mask built with device=...).
_CPU_DEVICE_CONSTANT = re.compile(r': Device = prim::Constant\[value="cpu"\]')
_BAKED_PRECISION = re.compile(r"\.(int8|bf16|fp16)\.(?:onnx|aoti\.pt2|pt2|pt|ts)$")


def model_format(path: Path) -> str:
    """'aoti', 'export', 'torchscript' or 'onnx' from the file name; ValueError for anything else."""
    name = path.name
    if name.endswith(AOTI_SUFFIX):
        return "aoti"
    if path.suffix == ".pt2":
        return "export"
    if path.suffix in (".pt", ".ts"):
        return "torchscript"
    if path.suffix == ".onnx":
        return "onnx"
    raise ValueError(
        f"unsupported model file {name}: expected .pt2 (torch.export), .aoti.pt2 (AOTInductor), "
        ".pt/.ts (TorchScript) or .onnx (ONNX Runtime)"
    )


def compiled_precision(path: Path) -> str | None:
    """The precision a file was built at when it is not fp32 (from its name), else None."""
    match = _BAKED_PRECISION.search(path.name)
    return match.group(1) if match else None


def runs_torch_operators(path: Path) -> bool:
    """Whether the model's operators go through torch's dispatcher (torch.export and TorchScript do; AOTInductor's and
    ONNX Runtime's compiled graphs do not): autocast and the operators' yield points (handlers/op_yield.py) reach them."""
    return model_format(path) in ("export", "torchscript")


def has_graph_points(path: Path) -> bool:
    """Whether the loaded model carries yield points in its graph (a torch.export program: _flat_call), which a bulk
    pass makes live (handlers/op_yield.py GraphYield); else they come from a dispatch mode."""
    return model_format(path) == "export"


def runs_under_autocast(path: Path) -> bool:
    """Whether torch.autocast reaches the model's ops."""
    return runs_torch_operators(path)


def load_program(path: Path, device: torch.device) -> Any:
    """A callable on `device` from any supported model file (see the table above)."""
    kind = model_format(path)
    if not path.is_file():
        raise FileNotFoundError(f"model file {path} not found in the archive")
    if kind == "aoti":
        return _load_aoti(path, device)
    if kind == "export":
        refuse_pickles(path)  # torch.export.load would unpickle what a crafted file carries
        program = torch.export.load(str(path))
        if device.type != "cpu":
            # A graph keeps the device it was exported on in ops such as arange(device=...) and
            # to(device) (a BERT's attention mask has them); module.to() would move only the weights.
            program = move_to_device_pass(program, device)
        module = program.module(check_guards=False)
        module.to(device)
        return _flat_call(module)
    if kind == "torchscript":
        module = torch.jit.load(str(path), map_location=device)
        if device.type != "cpu" and _CPU_DEVICE_CONSTANT.search(str(module.inlined_graph)):
            # map_location moves the weights, not a device written into the traced graph: such a file fails on
            # the first request ("attn_bias is on cpu", minilm traced on the CPU then run on an H200).
            raise ValueError(
                f"{path.name} was traced on the CPU and its graph creates tensors there, so it cannot run on {device}: "
                f"serve the torch.export format (.pt2) on GPUs, or trace the TorchScript file on a {device.type} machine"
            )
        module.eval()
        return module
    return OnnxModel(path, device)


def _flat_call(module: torch.fx.GraphModule) -> Callable[..., Any]:
    """The exported graph called with its tensors as they are: `program.module()` wraps it in pytree flattening,
    a guard call and forward hooks that check each input's shape against the exported constraints, about half of
    a one-row digits forward (docs/decisions.md, "Stream lanes"). Our decoders have already fixed the inputs' shapes
    and dtypes, so the same graph (same ops, same weights: identical outputs) runs without them. A wrong shape
    still fails, in the first op that meets it.
    After each operator the graph calls handlers/op_yield.py's `point()`: a background lane's yield point, which reads
    a module global and returns unless a bulk pass of this process asked for points (then a thread-local too)."""
    graph = copy.deepcopy(module.graph)
    graph.set_codegen(torch.fx.graph.CodeGen())  # positional tensors in, a tuple of outputs back
    add_points(graph)
    flat = torch.fx.GraphModule(module, graph)
    outputs = len(graph.output_node().args[0])

    def call(*inputs: torch.Tensor) -> Any:
        results = flat(*inputs)
        return results[0] if outputs == 1 else results

    return call


def _load_aoti(path: Path, device: torch.device):
    index = -1 if device.type == "cpu" else (device.index or 0)
    model = torch._inductor.aoti_load_package(str(path), device_index=index)
    compiled_for = str(model.get_metadata().get("AOTI_DEVICE_KEY", "cpu"))
    if compiled_for != device.type:
        raise ValueError(
            f"{path.name} was compiled by AOTInductor for {compiled_for} and cannot run on {device}; "
            f"build the archive for {device.type} on a {device.type} machine, or use the .pt2/.onnx format"
        )
    return model


class OnnxModel:
    """An onnxruntime session called like a module: torch tensors in (positionally, in the graph's
    input order), a torch tensor out on the same device."""

    def __init__(self, path: Path, device: torch.device) -> None:
        import onnxruntime  # only archives that ship an .onnx file need it

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        if device.type == "cuda":
            available = onnxruntime.get_available_providers()
            if "CUDAExecutionProvider" not in available:
                raise RuntimeError(
                    f"{path.name}: device {device} needs onnxruntime's CUDAExecutionProvider (the onnxruntime-gpu "
                    f"package); this onnxruntime has only {', '.join(available)}"
                )
            providers = [("CUDAExecutionProvider", {"device_id": device.index or 0}), "CPUExecutionProvider"]
        elif device.type == "cpu":
            providers = ["CPUExecutionProvider"]
        else:
            raise ValueError(f"{path.name}: onnxruntime runs on cpu or cuda, not {device}")
        self.device = device
        self.session = onnxruntime.InferenceSession(str(path), options, providers=providers)
        self.input_names = [node.name for node in self.session.get_inputs()]
        self.output = self.session.get_outputs()[0]
        self.providers = self.session.get_providers()

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        if len(inputs) != len(self.input_names):
            raise TypeError(
                f"the ONNX model takes {len(self.input_names)} inputs ({', '.join(self.input_names)}), got {len(inputs)}"
            )
        if self.device.type == "cuda":
            return self._run_bound(inputs)
        feed = {name: tensor.detach().cpu().numpy() for name, tensor in zip(self.input_names, inputs, strict=True)}
        return torch.from_numpy(self.session.run([self.output.name], feed)[0])

    def _run_bound(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """CUDA: bind the device tensors in place (no host round trip); the output lands in a torch tensor."""
        binding = self.session.io_binding()
        sizes: dict[str, int] = {}
        for name, tensor, node in zip(self.input_names, inputs, self.session.get_inputs(), strict=True):
            tensor = tensor.contiguous()
            for dim, size in zip(node.shape, tensor.shape, strict=True):
                if isinstance(dim, str):
                    sizes[dim] = int(size)
            binding.bind_input(
                name, "cuda", self.device.index or 0, _NUMPY_TYPES[tensor.dtype], list(tensor.shape), tensor.data_ptr()
            )
        shape = [dim if isinstance(dim, int) else sizes[dim] for dim in self.output.shape]
        output = torch.empty(shape, dtype=torch.float32, device=self.device)
        binding.bind_output(self.output.name, "cuda", self.device.index or 0, np.float32, shape, output.data_ptr())
        torch.cuda.current_stream(self.device).synchronize()  # inputs copied non_blocking must have landed
        self.session.run_with_iobinding(binding)
        return output


_NUMPY_TYPES = {torch.float32: np.float32, torch.int64: np.int64, torch.int32: np.int32, torch.float16: np.float16}
