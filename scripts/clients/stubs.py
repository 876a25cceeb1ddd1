"""Generate the gRPC client stubs from the protos inside the installed TorchServe (`make grpc-stubs`).

    python -m scripts.clients.stubs

The protos are taken from the model-server.jar of the TorchServe in this venv, so the stubs always
match the server that runs; nothing generated is committed (scripts/clients/grpc_stubs/*_pb2*.py is ignored).
"""

from __future__ import annotations

import importlib.util
import shutil
import zipfile
from pathlib import Path

from grpc_tools import protoc

from scripts import cli
from scripts.errors import ConfigError
from scripts.layout import BUILD, ROOT

PACKAGE = "scripts/clients/grpc_stubs"
PROTOS = ("inference.proto", "management.proto")


def torchserve_jar() -> Path:
    spec = importlib.util.find_spec("ts")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("torchserve is not installed in this Python: run `make venv`")
    jar = Path(spec.submodule_search_locations[0]) / "frontend" / "model-server.jar"
    if not jar.exists():
        raise ConfigError(f"{jar} not found: the torchserve install is incomplete, reinstall it with `make venv`")
    return jar


def extract_protos(jar: Path, proto_root: Path) -> list[Path]:
    """Copy the protos under proto_root/scripts/clients/grpc_stubs/ so protoc writes package-qualified imports
    (`from scripts.clients.grpc_stubs import inference_pb2`) instead of top-level ones."""
    target = proto_root / PACKAGE
    shutil.rmtree(proto_root, ignore_errors=True)
    target.mkdir(parents=True)
    with zipfile.ZipFile(jar) as archive:
        for name in PROTOS:
            (target / name).write_bytes(archive.read(f"proto/{name}"))
    return [target / name for name in PROTOS]


def include_dirs() -> list[Path]:
    """grpc_tools' well-known types (google/protobuf/empty.proto) and googleapis-common-protos'
    google/rpc/status.proto, which inference.proto imports for StreamPredictions2 errors."""
    well_known = Path(importlib.util.find_spec("grpc_tools").submodule_search_locations[0]) / "_proto"
    rpc = importlib.util.find_spec("google.rpc")
    if rpc is None:
        raise ConfigError("google/rpc/status.proto is missing: install googleapis-common-protos (requirements.txt)")
    googleapis_root = Path(rpc.submodule_search_locations[0]).parent.parent
    return [well_known, googleapis_root]


def build(out: Path = ROOT, proto_root: Path = BUILD / "grpc_protos") -> list[Path]:
    protos = extract_protos(torchserve_jar(), proto_root)
    args = ["grpc_tools.protoc", f"-I{proto_root}", *(f"-I{path}" for path in include_dirs())]
    args += [f"--python_out={out}", f"--grpc_python_out={out}"]
    args += [str(path.relative_to(proto_root)) for path in protos]
    if protoc.main(args) != 0:
        raise ConfigError(f"protoc failed on {', '.join(PROTOS)} from {torchserve_jar()}")
    generated = sorted((out / PACKAGE).glob("*_pb2*.py"))
    print(f"generated {', '.join(str(path.relative_to(out)) for path in generated)}")
    return generated


def main() -> int:
    cli.parser_for(__doc__).parse_args()
    build()
    return 0


if __name__ == "__main__":
    cli.run(main)
