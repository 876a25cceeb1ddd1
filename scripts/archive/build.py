"""Build model_store/<model>[-<version>].mar with torch-model-archiver.

    python -m scripts.archive.build --model digits --version 2.0
    python -m scripts.archive.build --model minilm --format onnx --precision int8   # -> model_store/minilm-onnx-int8.mar

The format (export | torchscript | aoti | onnx) and precision default to model-config.yaml's `format`
and `handler.precision`; the archived model-config.yaml names the built file in handler.model_file
(the handler picks the loader from its suffix) and carries the precision.

The archive holds the handler entry point at its root, the `handlers` package, the model's
model-config.yaml and the files its models/<model>/archive.py produces (trained and exported here).
Its sha256 goes next to it, in <archive>.mar.sha256, which registering checks (scripts/archive/reader.py).

Before building, the model's folder is checked against itself (models/registry.py: a per-lane key for a lane the
folder does not declare, missing samples); after, the built archive answers the folder's samples in this process,
and an archive that answers them otherwise than samples.json says is removed again. Each refusal names the fix.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from models import registry
from scripts import cli
from scripts.archive.reader import DIGEST_SUFFIX, MarFile
from scripts.errors import ArchiveError
from scripts.layout import BUILD, MODEL_STORE, ROOT

DEFAULT_VERSION = "1.0"


def archive_name(model: str, version: str, fmt: str | None = None, precision: str | None = None) -> str:
    """digits.mar for the default version and the config's format and precision; a version other than the
    default, then a format and a precision asked for (not None) are added in that order: digits-2.0.mar,
    digits-onnx.mar, digits-2.0-onnx.mar, minilm-onnx-int8.mar."""
    parts = [model] + [part for part in (version if version != DEFAULT_VERSION else None, fmt, precision) if part]
    return "-".join(parts)


def model_config(model_dir: Path) -> tuple[str, str]:
    """(format, precision) from the model's model-config.yaml."""
    import yaml

    config = yaml.safe_load((model_dir / "model-config.yaml").read_text())
    return str(config.get("format", "export")), str(config["handler"].get("precision", "fp32"))


def archived_config(text: str, fmt: str, model_file: str, precision: str) -> str:
    """model-config.yaml with the built format, file and precision, comments kept."""
    import yaml

    replacements = [
        (r"^format:.*$", f"format: {fmt}"),
        (r"^([ \t]+)model_file:.*$", rf"\g<1>model_file: {model_file}"),
        (r"^([ \t]+)precision:.*$", rf"\g<1>precision: {precision}"),
    ]
    for pattern, replacement in replacements:
        text, count = re.subn(pattern, replacement, text, count=1, flags=re.MULTILINE)
        if count != 1:
            raise ArchiveError(f"model-config.yaml has no line matching {pattern!r} to set")
    config = yaml.safe_load(text)
    handler = config["handler"]
    if (config["format"], handler["model_file"], handler["precision"]) != (fmt, model_file, precision):
        raise ArchiveError(f"could not set format/model_file/precision in model-config.yaml: got {config}")
    return text


def sample_disagreements(archive: Path, samples: registry.Samples) -> tuple[int, list[str]]:
    """(samples answered as expected, what differs for the others) with the built archive's core in this process."""
    from handlers.decoding import Payload
    from scripts.archive.core import load_core

    response = load_core(archive).answer([Payload(items=list(samples.instances), raw=False)])[0]
    if response.status != 200:
        return 0, [f"HTTP {response.status} {str(response.body)[:200]}"]
    agreeing, problems = 0, []
    for position, (prediction, answer) in enumerate(zip(_predictions(response.body), samples.answers, strict=True)):
        problem = samples.problem(prediction, answer)
        agreeing += problem is None
        if problem:
            problems.append(f"sample {position}: {problem}")
    return agreeing, problems


def _predictions(body) -> list:
    import orjson

    return (orjson.loads(body) if isinstance(body, (bytes, str)) else body)["predictions"]


def check_samples(archive: Path, model: str) -> None:
    """Refuse (and remove) a built archive that answers its model's samples otherwise than samples.json says."""
    samples = registry.model(model).samples()
    agreeing, problems = sample_disagreements(archive, samples)
    if agreeing >= samples.min_agreement * len(samples.instances):
        print(f"  answers {agreeing} of {len(samples.instances)} samples as models/{model}/{registry.SAMPLES_FILE} says")
        return
    archive.unlink(missing_ok=True)
    Path(f"{archive}{DIGEST_SUFFIX}").unlink(missing_ok=True)
    raise ArchiveError(
        f"{archive.name} answers {agreeing} of {len(samples.instances)} samples as models/{model}/{registry.SAMPLES_FILE} "
        f"says (needs {samples.min_agreement:.0%}), so it was removed: {'; '.join(problems[:3])}. If the model changed on "
        f"purpose, write its samples again (python -m models.{model}.samples) and check the new answers"
    )


def build(
    model: str,
    version: str,
    model_store: Path,
    build_dir: Path,
    fmt: str | None = None,
    precision: str | None = None,
    check_answers: bool = True,
) -> Path:
    """model_store/<name>.mar; check_answers=False keeps an archive that answers its samples wrongly (the tests
    build one to show that hot-swap's gate refuses it too)."""
    try:
        found = registry.model(model)
    except registry.RegistryError as error:
        raise ArchiveError(str(error)) from None
    problems = registry.check(found)
    if problems:
        raise ArchiveError(f"models/{model} contradicts itself:\n  " + "\n  ".join(problems))
    model_dir = found.folder
    default_format, default_precision = model_config(model_dir)
    asked_format, asked_precision = fmt, precision
    fmt, precision = fmt or default_format, precision or default_precision
    from models import export_formats

    try:
        export_formats.check(fmt, precision)
    except ValueError as error:
        raise ArchiveError(str(error)) from None
    files = importlib.import_module(f"models.{model}.archive").artifacts(version, build_dir, fmt, precision)
    model_store.mkdir(parents=True, exist_ok=True)
    # Named after what was asked for on the command line (make archive FORMAT=export -> digits-export.mar).
    name = archive_name(model, version, asked_format, asked_precision)
    with tempfile.TemporaryDirectory() as staging:
        extra = Path(staging) / "extra"
        # The archiver copies a folder's *contents*: stage one holding handlers/ so the package survives.
        shutil.copytree(ROOT / "handlers", extra / "handlers", ignore=shutil.ignore_patterns("__pycache__"))
        for file in files:
            shutil.copy2(file, extra / file.name)
        config = Path(staging) / "model-config.yaml"
        config.write_text(archived_config((model_dir / "model-config.yaml").read_text(), fmt, files[0].name, precision))
        command = [
            str(Path(sys.executable).parent / "torch-model-archiver"),
            "--model-name",
            model,
            "--version",
            version,
            "--handler",
            str(ROOT / "handlers" / "torchserve" / "torchserve_handler.py"),
            "--extra-files",
            str(extra),
            "--config-file",
            str(config),
            "--export-path",
            staging,
            "--force",
        ]
        subprocess.run(command, check=True)
        # The manifest keeps the model's own name; only the file name carries the version.
        target = model_store / f"{name}.mar"
        shutil.move(Path(staging) / f"{model}.mar", target)
    digest = MarFile(target).record_digest()
    print(f"built {target} ({target.stat().st_size / 1e6:.1f} MB, {model} version {version}, {fmt} {precision}: {files[0].name})")
    print(f"  sha256 {digest} recorded in {target.name}{DIGEST_SUFFIX} (registering checks it)")
    if check_answers:
        check_samples(target, model)
    return target


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--model", required=True, help="a folder of models/ (python -m models.registry names)")
    parser.add_argument("--version", default=DEFAULT_VERSION)
    parser.add_argument("--model-store", type=Path, default=MODEL_STORE)
    parser.add_argument("--build-dir", type=Path, default=BUILD)
    parser.add_argument("--format", help="export | torchscript | aoti | onnx (default: model-config.yaml's format)")
    parser.add_argument("--precision", help="fp32 | bf16 | fp16 | int8 (default: model-config.yaml's handler.precision)")
    args = parser.parse_args()
    build(args.model, args.version, args.model_store, args.build_dir, args.format or None, args.precision or None)
    return 0


if __name__ == "__main__":
    cli.run(main)
