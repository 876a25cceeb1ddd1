"""What the prepared device calls carry beside the working tree, in build/gpu-device/ (docs/gpu.md):

    python -m scripts.gpu.device_prep [--models NAME ...]     (make gpu-device-prep)

- common/ (every call carries it): torchserve.tar.xz, the serving bundle (scripts/gpu/serving_bundle.py), unpacked
  there into build/gpu-serving; noop.mar with its sha256 (the GPU machine has no torch-model-archiver); site/, the
  pure-Python packages a model's eager module imports; wheels/, orjson for Python 3.12 (the handler imports it; the
  GPU machine lacks it), downloaded once by pip;
- <model>/ for each model in models/ (a call carries its own): what its folder declares travels
  (models/<name>/portable.py: the plain weights, fp16-rounded or pruned to what the device's inputs use where the
  model says so), archive/ (the archive's entries but its code and model file) and items.json. The archive is
  assembled there around a .pt2 exported there and the working tree's handler code (scripts/gpu/device_run.py), so
  neither another torch's file nor a stale archive can mislead.

One call, `sh scripts/gpu/device_call.sh <model>`, carries build/gpu-device/common and build/gpu-device/<model>:
with the ~4 MiB working tree, under the 64 MiB a call carries; the sizes are printed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from models import registry
from scripts import cli
from scripts.archive.reader import MarFile
from scripts.bench.peers.noop_handler import build_noop_archive
from scripts.gpu import serving_bundle
from scripts.gpu.bundle import SITE, write_model
from scripts.layout import BUILD

OUT = BUILD / "gpu-device"
COMMON = "common"
ORJSON = "orjson==3.13.0"  # locks/serving-cpu.txt
CARRY_LIMIT = 64 << 20  # bytes one device call carries, the working tree included


def download_orjson(common: Path) -> None:
    wheels = common / "wheels"
    if any(wheels.glob("orjson-*-cp312-*.whl")):
        return
    wheels.mkdir(parents=True, exist_ok=True)
    platforms = ["--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12"]
    subprocess.run([*command, "--implementation", "cp", *platforms, "-d", str(wheels), ORJSON], check=True)


def size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--out", type=Path, default=OUT)
    names = list(registry.models())
    parser.add_argument("--models", nargs="+", choices=names, default=names)
    args = parser.parse_args()
    common = args.out / COMMON
    common.mkdir(parents=True, exist_ok=True)
    serving_bundle.ensure_tree()
    shutil.copy2(serving_bundle.ensure_packed(serving_bundle.DEFAULT_OUT), common / serving_bundle.PACKED)
    noop = build_noop_archive(BUILD / "gpu-device-noop")
    MarFile(noop).record_digest()
    MarFile(noop).copy(common / "noop.mar")
    download_orjson(common)
    for name in args.models:
        folder = args.out / name
        if folder.exists():
            shutil.rmtree(folder)
        # The stream benches' requests travel too: a model that prunes its weights keeps what they use.
        samples = list(registry.model(name).samples().instances)
        write_model(name, args.out, samples, site=common / SITE, reference=False)
    shared = size(common)
    print(f"device carry -> {args.out}: common/ {shared / 2**20:.1f} MiB")
    for name in args.models:
        mine = size(args.out / name)
        print(f"  {name}/ {mine / 2**20:.1f} MiB: a call carries {(shared + mine) / 2**20:.1f} MiB and the working tree")
        if shared + mine > CARRY_LIMIT - (4 << 20):
            print(f"  {name}: over what one call carries with a ~4 MiB working tree ({CARRY_LIMIT >> 20} MiB)", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    cli.run(main)
