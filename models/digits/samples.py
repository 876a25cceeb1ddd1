"""Held-out digits as the payloads clients send: JSON grids, PNG bytes in several looks, and batch-job
input files (tests, benchmarks, verify, `make batch-job`).

    python -m models.digits.samples --rows 100000 --output build/batch/digits-100k.jsonl   # or .parquet
    python -m models.digits.samples --samples    # models/digits/samples.json: held-out rows and their true labels
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
from PIL import Image

from models import registry
from models.digits.data import load_split
from scripts import cli

# The registry's samples (the swap gate, the warm-up, make archive's check): true labels, so a good model agrees
# with most, not all (the gate's threshold).
SAMPLE_ROWS = 200
MIN_AGREEMENT = 0.95


def held_out(count: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    split = load_split()
    return split.test_x[:count], split.test_y[:count]


def grid_png(grid: np.ndarray) -> bytes:
    """The 8x8 grid itself as an 8x8 greyscale PNG, light ink on black like the dataset."""
    return _png(Image.fromarray((grid * 255.0 / 16.0).round().astype(np.uint8), mode="L"))


def scanned_png(grid: np.ndarray, scale: int = 12, colour: bool = True, dark_ink: bool = True) -> bytes:
    """A larger picture of the digit: upscaled, optionally RGB, dark ink on light paper with a margin."""
    ink = np.kron(grid / 16.0, np.ones((scale, scale)))
    ink = np.pad(ink, scale * 2)
    pixels = ((1.0 - ink) if dark_ink else ink) * 255.0
    image = Image.fromarray(pixels.round().astype(np.uint8), mode="L")
    return _png(image.convert("RGB") if colour else image)


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@dataclass(frozen=True)
class DigitRows:
    """`count` rows cycling through the held-out split: 64 values each, with the true labels."""

    instances: list[list[float]]
    labels: list[int]


def digit_rows(count: int | None = None) -> DigitRows:
    """All held-out digits once (count None), or `count` rows repeating them in order."""
    grids, labels = held_out()
    flat = grids.reshape(len(grids), -1)
    picks = np.arange(len(grids) if count is None else count) % len(grids)
    # Integral values as ints: the same JSON a user would write, 0..16.
    instances = [[int(v) if float(v).is_integer() else float(v) for v in flat[i]] for i in picks]
    return DigitRows(instances, [int(labels[i]) for i in picks])


def write_jsonl(path: Path, rows: DigitRows) -> Path:
    """One {"id": "digit-<n>", "instance": [...]} per row: batch-job input."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        for number, instance in enumerate(rows.instances):
            out.write(orjson.dumps({"id": f"digit-{number}", "instance": instance}) + b"\n")
    return path


def write_parquet(path: Path, rows: DigitRows) -> Path:
    """The same rows as write_jsonl in Parquet: an `id` column and an `instance` column of lists of 64 ints."""
    import pyarrow as pa  # the batch-job tools' dependency, not the serving image's
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    ids = [f"digit-{number}" for number in range(len(rows.instances))]
    pq.write_table(pa.table({"id": ids, "instance": rows.instances}), path)
    return path


def write_samples() -> Path:
    rows = digit_rows(SAMPLE_ROWS)
    pairs = [(instance, {"label": label}) for instance, label in zip(rows.instances, rows.labels, strict=True)]
    return registry.write_samples(Path(__file__).resolve().parent, pairs, {"equal": ["label"]}, MIN_AGREEMENT)


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--rows", type=int, default=None, help="rows to write (default: the held-out split once)")
    parser.add_argument("--output", type=Path, help=".jsonl or .parquet")
    parser.add_argument("--samples", action="store_true", help="write the model's samples.json instead")
    args = parser.parse_args()
    if args.samples:
        print(f"wrote {write_samples()}")
        return 0
    if args.output is None:
        parser.error("--output is required (or --samples)")
    write = write_parquet if args.output.suffix == ".parquet" else write_jsonl
    print(f"wrote {write(args.output, digit_rows(args.rows))}")
    return 0


if __name__ == "__main__":
    cli.run(main)
