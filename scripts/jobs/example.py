"""An example batch-job input for any model: its samples (models/<name>/samples.json) cycled to N rows, as JSONL
or Parquet (by the output's suffix).

    python -m scripts.jobs.example --model efficientnet_lite0 --rows 1000 --output build/batch/example.jsonl
    python -m scripts.jobs.example --model digits --rows 1000000 --output build/batch/digits.parquet

`make batch-job` builds one for BATCH_MODEL and runs it through the model's bulk lane. Each row is
{"id": "<model>-<n>", "instance": <sample>}, the input scripts/jobs/inputs.py reads; the answers each sample must
get are in the same samples.json, so a job's output can be checked row by row.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from models import registry
from scripts import cli


def write_example(model: str, rows: int, output: Path) -> Path:
    """`rows` rows of `model`'s samples, in order and cycled, written to `output`: Parquet for a .parquet name (an
    `id` and an `instance` column, lists of numbers, strings or structs as the samples are), JSONL otherwise."""
    instances = registry.model(model).samples().request(rows)
    output.parent.mkdir(parents=True, exist_ok=True)
    if output.suffix == ".parquet":
        import pyarrow as pa  # the batch-job tools' dependency, not the serving image's
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"id": [f"{model}-{n}" for n in range(rows)], "instance": instances}), output)
        return output
    with output.open("wb") as out:
        for number, instance in enumerate(instances):
            out.write(orjson.dumps({"id": f"{model}-{number}", "instance": instance}) + b"\n")
    return output


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--model", required=True, choices=sorted(registry.models()))
    parser.add_argument("--rows", type=int, default=1000, help="rows to write (default %(default)s)")
    parser.add_argument("--output", type=Path, required=True, help="the .jsonl or .parquet file to write")
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error("--rows must be at least 1")
    print(f"wrote {write_example(args.model, args.rows, args.output)}: {args.rows} rows of {args.model}'s samples")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
