"""Held-out digits as batch-job input: the 360 held-out grids, repeated to any number of rows.

    python -m scripts.digits_inputs --rows 100000 --output build/batch/digits-100k.jsonl
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from models.digits.samples import held_out


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
    return DigitRows([[int(v) if float(v).is_integer() else float(v) for v in flat[i]] for i in picks], [int(labels[i]) for i in picks])


def write_jsonl(path: Path, rows: DigitRows) -> Path:
    """One {"id": "digit-<n>", "instance": [...]} per row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        for number, instance in enumerate(rows.instances):
            out.write(orjson.dumps({"id": f"digit-{number}", "instance": instance}) + b"\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=None, help="rows to write (default: the held-out split once)")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    path = write_jsonl(args.output, digit_rows(args.rows))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
