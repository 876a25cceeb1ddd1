"""Loader choice by file name, the build's naming, and the archived model-config.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from handlers.model_files import compiled_precision, load_program, model_format, runs_under_autocast
from models import export_formats
from scripts.archive.build import archive_name, archived_config
from scripts.layout import ROOT


@pytest.mark.parametrize(
    ("name", "fmt", "autocast", "precision"),
    [
        ("digits.pt2", "export", True, None),
        ("digits.aoti.pt2", "aoti", False, None),
        ("digits.bf16.aoti.pt2", "aoti", False, "bf16"),
        ("digits.ts", "torchscript", True, None),
        ("model.pt", "torchscript", True, None),
        ("minilm.onnx", "onnx", False, None),
        ("minilm.int8.onnx", "onnx", False, "int8"),
    ],
)
def test_the_loader_comes_from_the_file_name(name, fmt, autocast, precision):
    path = Path(name)
    assert (model_format(path), runs_under_autocast(path), compiled_precision(path)) == (fmt, autocast, precision)


def test_an_unknown_suffix_is_refused_naming_the_supported_ones(tmp_path):
    with pytest.raises(
        ValueError, match=r"\.pt2 \(torch.export\), \.aoti\.pt2 \(AOTInductor\), \.pt/\.ts \(TorchScript\) or \.onnx"
    ):
        load_program(tmp_path / "model.pkl", torch.device("cpu"))
    with pytest.raises(FileNotFoundError, match="digits.onnx"):
        load_program(tmp_path / "digits.onnx", torch.device("cpu"))


@pytest.mark.parametrize(
    ("stem", "fmt", "precision", "name"),
    [
        ("digits", "export", "fp32", "digits.pt2"),
        ("digits", "export", "bf16", "digits.pt2"),  # autocast at run time: the fp32 file
        ("digits", "aoti", "bf16", "digits.bf16.aoti.pt2"),
        ("minilm", "onnx", "int8", "minilm.int8.onnx"),
        ("minilm", "torchscript", "fp16", "minilm.ts"),
    ],
)
def test_file_names_per_format_and_precision(stem, fmt, precision, name):
    assert export_formats.file_name(stem, fmt, precision) == name


@pytest.mark.parametrize(("fmt", "precision"), [("onnx", "bf16"), ("aoti", "int8"), ("export", "int8"), ("tflite", "fp32")])
def test_unsupported_combinations_are_refused(fmt, precision):
    with pytest.raises(ValueError, match="cannot run at precision|unknown format"):
        export_formats.check(fmt, precision)


def test_archive_names():
    assert archive_name("digits", "1.0") == "digits"
    assert archive_name("digits", "1.0", "onnx") == "digits-onnx"
    assert archive_name("digits", "2.0", "aoti") == "digits-2.0-aoti"
    assert archive_name("minilm", "1.0", "onnx", "int8") == "minilm-onnx-int8"


@pytest.mark.parametrize("model", ["digits", "minilm"])
def test_the_archived_config_names_the_built_file_and_keeps_the_rest(model):
    text = (ROOT / "models" / model / "model-config.yaml").read_text()
    original = yaml.safe_load(text)
    assert original["format"] == export_formats.DEFAULT_FORMAT
    changed = yaml.safe_load(archived_config(text, "onnx", f"{model}.int8.onnx", "int8"))
    assert changed["format"] == "onnx"
    assert changed["handler"] == {**original["handler"], "model_file": f"{model}.int8.onnx", "precision": "int8"}
    assert {k: v for k, v in changed.items() if k not in ("format", "handler")} == {
        k: v for k, v in original.items() if k not in ("format", "handler")
    }


@pytest.mark.parametrize("model", ["digits", "minilm"])
def test_the_export_program_is_called_flat_with_the_same_outputs(model):
    """load_program calls the exported graph without torch.export's input checks (docs/decisions.md, "Stream lanes"):
    the same graph and weights, so the same numbers as the checked module, to the last bit; a wrong shape still
    fails."""
    from tests.unit.formats.conftest import digits_file, minilm_file

    path = digits_file("export") if model == "digits" else minilm_file("export")
    checked = torch.export.load(str(path)).module()
    flat = load_program(path, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    if model == "digits":
        cases = [(torch.rand(rows, 1, 8, 8, generator=generator) * 16,) for rows in (1, 7, 33)]
        wrong = (torch.rand(2, 3, 8, 8),)
    else:
        cases = [
            (torch.randint(1000, 2000, (rows, length), generator=generator), torch.ones(rows, length, dtype=torch.long))
            for rows, length in ((1, 5), (3, 40))
        ]
        wrong = (torch.ones(2, 5, 7, dtype=torch.long), torch.ones(2, 5, dtype=torch.long))
    with torch.inference_mode():
        for inputs in cases:
            expected = checked(*inputs)
            got = flat(*inputs)
            assert got.shape == expected.shape and torch.equal(got, expected)
        with pytest.raises(Exception):  # noqa: B017, PT011 (the op that meets it raises whatever it raises)
            flat(*wrong)
