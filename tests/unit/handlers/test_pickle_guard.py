"""A torch.export file carrying a pickle is refused before torch.export.load could run it.

Each crafted file holds a pickle that creates a marker file when unpickled. The control shows that
torch.export.load itself does unpickle it (so the test can fail); the handler's loader must refuse it
with a message naming the member, and the marker must not appear.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import pytest
import torch

from handlers.model_files import load_program
from handlers.pickle_guard import PickleInModelFile, refuse_pickles

CPU = torch.device("cpu")


class CreatesFile:
    """Unpickling this opens `path` for writing: harmless, and visible."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def rewritten(source: Path, target: Path, changes: dict[str, bytes]) -> Path:
    """A copy of the .pt2 zip `source` with members (named by their ending) replaced."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for entry in old.infolist():
            ending = next((end for end in changes if entry.filename.endswith(end)), None)
            new.writestr(entry, changes[ending] if ending else old.read(entry))
    return target


def with_pickled_sample_inputs(source: Path, target: Path, marker: Path) -> Path:
    """torch.export.load tries weights_only=True on the sample inputs, then falls back to a full unpickle."""
    return rewritten(source, target, {"data/sample_inputs/model.pt": pickle.dumps(CreatesFile(marker), protocol=2)})


def with_a_pickled_weight(source: Path, target: Path, marker: Path) -> Path:
    """A weight flagged use_pickle is read with torch.load(weights_only=False)."""
    with zipfile.ZipFile(source) as old:
        config_name = next(name for name in old.namelist() if name.endswith("_weights_config.json"))
        config = json.loads(old.read(config_name))
    first = next(iter(config["config"].values()))
    first["use_pickle"] = True
    changes = {config_name: json.dumps(config).encode(), "data/weights/" + first["path_name"]: pickle.dumps(CreatesFile(marker))}
    return rewritten(source, target, changes)


CRAFTED = {
    "sample inputs": (with_pickled_sample_inputs, "digits/data/sample_inputs/model.pt holds a pickle"),
    "pickled weight": (
        with_a_pickled_weight,
        "'features.0.weight' in digits/data/weights/model_weights_config.json is stored as a pickle",
    ),
}


@pytest.mark.parametrize("kind", list(CRAFTED))
def test_torch_export_load_would_run_the_pickle(digits_model_dir, tmp_path, kind):
    craft, _ = CRAFTED[kind]
    marker = tmp_path / "unpickled"
    crafted = craft(digits_model_dir / "digits.pt2", tmp_path / "digits.pt2", marker)
    try:
        torch.export.load(str(crafted))
    except Exception:
        pass  # the file is broken after the pickle ran; what matters is that it ran
    assert marker.exists()


@pytest.mark.parametrize("kind", list(CRAFTED))
def test_the_handlers_loader_refuses_it_without_unpickling(digits_model_dir, tmp_path, kind):
    craft, message = CRAFTED[kind]
    marker = tmp_path / "unpickled"
    crafted = craft(digits_model_dir / "digits.pt2", tmp_path / "digits.pt2", marker)
    with pytest.raises(PickleInModelFile, match=f"^digits.pt2: {message}"):
        load_program(crafted, CPU)
    assert not marker.exists()


def test_an_exported_model_passes_the_guard(digits_model_dir):
    """Every core this project loads (unit and integration tests, every worker) goes through the guard too."""
    assert refuse_pickles(digits_model_dir / "digits.pt2") is None


def test_a_file_that_is_no_zip_is_refused(tmp_path):
    (tmp_path / "digits.pt2").write_bytes(pickle.dumps(CreatesFile(tmp_path / "unpickled")))
    with pytest.raises(PickleInModelFile, match="not a torch.export file"):
        load_program(tmp_path / "digits.pt2", CPU)
    assert not (tmp_path / "unpickled").exists()
