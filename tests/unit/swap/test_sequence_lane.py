"""The digits-seq archive variant: TorchServe's sequence-batching keys added, everything else as built."""

from __future__ import annotations

import zipfile

import pytest
import yaml

from scripts.archive.variant import write_variant
from scripts.swap.sequence_lane import SEQUENCE_CONFIG, write_sequence_archive

CONFIG = {"responseTimeout": 300, "handler": {"task": "digit_classification", "model_file": "digits.pt2", "max_batch_rows": 512}}


@pytest.fixture
def archive(tmp_path):
    path = tmp_path / "digits.mar"
    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("model-config.yaml", yaml.safe_dump(CONFIG))
        mar.writestr("digits.pt2", b"weights")
    return path


def test_the_sequence_archive_adds_sequence_batching_and_keeps_the_rest(archive, tmp_path):
    target = write_sequence_archive(archive, tmp_path / "digits-seq.mar")
    with zipfile.ZipFile(target) as mar:
        config = yaml.safe_load(mar.read("model-config.yaml"))
        assert mar.read("digits.pt2") == b"weights"
    assert config["sequenceBatching"] is True and config["maxSequenceJobQueueSize"] == SEQUENCE_CONFIG["maxSequenceJobQueueSize"]
    assert config["handler"] == CONFIG["handler"] and config["responseTimeout"] == 300


def test_top_level_changes_may_not_replace_the_handler_section(archive, tmp_path):
    with pytest.raises(ValueError, match="pass its keys as `handler`"):
        write_variant(archive, tmp_path / "bad.mar", {}, {"handler": {"task": "other"}})
