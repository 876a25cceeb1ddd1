"""Train the digits CNN on the fixed split and export it with torch.export (dynamic batch axis, no pickle).

python -m models.digits.train --seed 1 --out build/digits/1.0
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch import nn

from models.digits.data import load_split
from models.digits.network import DigitsNet
from scripts import cli
from scripts.errors import ArchiveError

EPOCHS = 40
BATCH = 64
MAX_EXPORT_BATCH = 1 << 16


def train(seed: int) -> tuple[DigitsNet, float]:
    torch.manual_seed(seed)
    split = load_split()
    x = torch.from_numpy(split.train_x).unsqueeze(1)
    y = torch.from_numpy(split.train_y)
    model = DigitsNet()
    optimiser = torch.optim.Adam(model.parameters(), lr=2e-3)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(EPOCHS):
        model.train()
        for index in torch.randperm(len(x), generator=generator).split(BATCH):
            optimiser.zero_grad()
            loss = nn.functional.cross_entropy(model.logits(_augment(x[index], generator)), y[index])
            loss.backward()
            optimiser.step()
    model.eval()
    return model, held_out_accuracy(model)


def _augment(grids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Shift by up to one cell: images from users are rarely centred exactly like the training set."""
    dy, dx = torch.randint(-1, 2, (2,), generator=generator).tolist()
    return torch.roll(grids, shifts=(dy, dx), dims=(2, 3))


@torch.inference_mode()
def held_out_accuracy(model: nn.Module) -> float:
    split = load_split()
    probabilities = model(torch.from_numpy(split.test_x).unsqueeze(1))
    return float((probabilities.argmax(1).numpy() == split.test_y).mean())


def export(model: DigitsNet, path: Path) -> None:
    batch = torch.export.Dim("batch", min=1, max=MAX_EXPORT_BATCH)
    example = (torch.zeros(4, 1, 8, 8),)
    program = torch.export.export(model, example, dynamic_shapes=({0: batch},))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True, help="folder for digits.pt2 and metrics.json")
    parser.add_argument("--min-accuracy", type=float, default=0.97)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    started = time.perf_counter()
    model, accuracy = train(args.seed)
    seconds = time.perf_counter() - started
    export(model, args.out / "digits.pt2")
    metrics = {"seed": args.seed, "held_out_accuracy": accuracy, "train_seconds": round(seconds, 1), "epochs": EPOCHS}
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(f"digits seed={args.seed}: held-out accuracy {accuracy:.4f}, trained in {seconds:.1f}s -> {args.out / 'digits.pt2'}")
    if accuracy < args.min_accuracy:
        raise ArchiveError(f"held-out accuracy {accuracy:.4f} is below the required {args.min_accuracy}")
    return 0


if __name__ == "__main__":
    cli.run(main)
