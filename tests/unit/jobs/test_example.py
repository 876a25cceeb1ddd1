"""`make batch-job`'s example input for any model (scripts/jobs/example.py) and the clients' sample body
(scripts/clients/rest.py): both from the model's samples.json, so neither names a model."""

from __future__ import annotations

import orjson
import pytest

from models import registry
from scripts.clients.rest import sample_body
from scripts.errors import ConfigError
from scripts.jobs.example import write_example
from scripts.jobs.inputs import open_input

MODELS = sorted(registry.models())


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize("model", MODELS)
def test_an_example_job_cycles_the_models_samples_and_reads_back_as_a_job_input(model, suffix, tmp_path):
    samples = registry.model(model).samples().instances
    rows = len(samples) + 3
    path = write_example(model, rows, tmp_path / f"example{suffix}")
    read = [row for chunk in open_input(path).chunks(4) for row in chunk.rows_with_instances()]
    assert [str(row.id) for row in read] == [f"{model}-{i}" for i in range(rows)]
    instances = [row.instance.tolist() if hasattr(row.instance, "tolist") else row.instance for row in read]
    assert instances == [samples[i % len(samples)] for i in range(rows)]
    if suffix == ".jsonl":
        lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
        assert [line["instance"] for line in lines] == instances


def test_the_clients_send_a_sample_of_the_lanes_model():
    for lane in registry.lanes():
        samples = registry.model(lane.model).samples().instances
        assert orjson.loads(sample_body(lane.name, 0)) == {"instances": [samples[0]]}
    with pytest.raises(ConfigError, match=r"digits has samples 0\.\.\d+ \(models/digits/samples.json\), not 100000"):
        sample_body("digits-bulk", 100000)
