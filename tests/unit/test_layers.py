"""Static check: imports run one way, from the top down, no two modules import each other, and the serving image
carries only the product.

Each package sits on a layer (docs/architecture.md, "Layers"); a package may import packages of lower
layers only, never one of its own layer or above. Imports are read with Python's ast, so an import inside
a function or under `if TYPE_CHECKING:` counts as much as one at the top (a circle of types is a circle).
A new package fails here until it is given a layer.
"""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

import pytest

from scripts.layout import ROOT

# Bottom to top. `scripts.errors`, `scripts.layout` and `scripts.cli` are single modules every command shares.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("handlers",),
    ("scripts.errors", "scripts.layout"),
    ("scripts.cli",),
    ("scripts.wrk",),
    ("models",),
    ("scripts.archive",),
    ("scripts.server",),
    ("scripts.clients",),
    ("scripts.jobs", "scripts.swap", "scripts.deploy", "scripts.container"),
    ("scripts.verify", "scripts.bench", "scripts.image_check", "scripts.streams"),
    ("scripts.hardening", "scripts.gpu"),
)
# The serving image (Dockerfile) runs the container's commands only: its archives are built and tested outside it.
IMAGE_COMMANDS = (
    "scripts.container.config",
    "scripts.container.entrypoint",
    "scripts.container.healthcheck",
)
SCANNED = ("handlers", "models", "scripts")
GENERATED = ("scripts/clients/grpc_stubs",)


def layer_of(package: str) -> int:
    for level, packages in enumerate(LAYERS):
        if package in packages:
            return level
    raise LookupError(package)


def package_of(module: str) -> str:
    """`scripts.bench.loadgen` -> `scripts.bench`; `scripts.cli` -> itself; `handlers.tasks.digits` -> `handlers`."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "scripts" and len(parts) > 1 else parts[0]


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files() -> list[Path]:
    files = (path for top in SCANNED for path in (ROOT / top).rglob("*.py"))
    return sorted(path for path in files if not any(path.relative_to(ROOT).as_posix().startswith(g) for g in GENERATED))


def imported_modules(path: Path) -> set[str]:
    """Every project module `path` imports (`from scripts.bench import plots` names `scripts.bench.plots`)."""
    found = set()
    here = module_of(path).split(".")
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = here if path.name == "__init__.py" else here[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found.update(f"{base}.{alias.name}" if is_module(f"{base}.{alias.name}") else base for alias in node.names)
    return {module for module in found if module.split(".")[0] in SCANNED}


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def upward_imports(files: list[Path]) -> list[str]:
    """`file: package (layer) imports package (layer)` for each import that does not point down."""
    wrong = []
    for path in files:
        package = package_of(module_of(path))
        for target in sorted({package_of(module) for module in imported_modules(path)} - {package, "scripts"}):
            if layer_of(target) >= layer_of(package):
                wrong.append(f"{path.relative_to(ROOT)}: {package} ({layer_of(package)}) imports {target} ({layer_of(target)})")
    return wrong


def test_every_package_has_a_layer():
    packages = {package_of(module_of(path)) for path in source_files()} - {"scripts"}
    unplaced = sorted(package for package in packages if not any(package in layer for layer in LAYERS))
    assert unplaced == [], f"give each a layer in LAYERS (and docs/architecture.md): {unplaced}"


def test_imports_point_down_the_layers():
    assert upward_imports(source_files()) == []


def test_the_check_catches_an_upward_and_a_sideways_import(tmp_path, monkeypatch):
    # The test above can fail: archive importing server (a layer up), jobs importing swap (its own layer),
    # and a type-only import count; a relative import is resolved against its package.
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    sources = {
        "scripts/archive/lane.py": "from scripts.server.config import LaneSettings\n",
        "scripts/jobs/job.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from scripts.swap import gates\n",
        "scripts/swap/fine.py": "from scripts import cli\nfrom ..archive import reader\nimport handlers.core\n",
        "scripts/bench/up.py": "from ..hardening import soak\n",
        "scripts/cli.py": "from scripts.errors import ScriptError\n",
    }
    for name, text in sources.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert upward_imports(sorted(tmp_path.rglob("*.py"))) == [
        "scripts/archive/lane.py: scripts.archive (5) imports scripts.server (6)",
        "scripts/bench/up.py: scripts.bench (9) imports scripts.hardening (10)",
        "scripts/jobs/job.py: scripts.jobs (8) imports scripts.swap (8)",
    ]


def module_graph(files: list[Path]) -> dict[str, set[str]]:
    """Each module and the project modules it imports (a name that is not a module counts as its package)."""
    modules = {module_of(path) for path in files}
    graph = {}
    for path in files:
        targets = set()
        for name in imported_modules(path):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            targets.add(name)
        graph[module_of(path)] = targets - {"", module_of(path)}
    return graph


def test_no_modules_import_each_other_round_a_circle():
    # Inside a package too: two modules importing each other (even for a type only) are one concern or need a third.
    try:
        graphlib.TopologicalSorter(module_graph(source_files())).prepare()
    except graphlib.CycleError as error:
        pytest.fail(f"import circle: {' -> '.join(error.args[1])}")


def test_the_circle_check_sees_a_type_only_import(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "scripts" / "bench").mkdir(parents=True)
    (tmp_path / "scripts" / "bench" / "__init__.py").write_text("")
    (tmp_path / "scripts" / "bench" / "stream.py").write_text("from scripts.bench import plots\n")
    (tmp_path / "scripts" / "bench" / "plots.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from scripts.bench.stream import ModelBench\n"
    )
    graph = module_graph(sorted(tmp_path.rglob("*.py")))
    assert graph == {
        "scripts.bench": set(),
        "scripts.bench.plots": {"scripts.bench.stream"},
        "scripts.bench.stream": {"scripts.bench.plots"},
    }
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter(graph).prepare()


def image_copies() -> set[str]:
    """The repository paths the Dockerfile COPYs into the image."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    copied = set()
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["COPY"]:
            copied.update(word.rstrip("/") for word in words[1:-1] if not word.startswith("--"))
    return copied


def image_closure() -> set[Path]:
    """The project files the image's commands import, directly or not."""
    by_module = {module_of(path): path for path in source_files()}
    todo, seen = list(IMAGE_COMMANDS), set()
    while todo:
        module = todo.pop()
        path = by_module.get(module)
        if path is None or path in seen:
            continue
        seen.add(path)
        todo.extend(imported_modules(path))
        todo.extend(module.rsplit(".", depth)[0] for depth in range(1, module.count(".") + 1))  # the packages above
    return seen


def test_the_serving_image_copies_what_it_runs_and_no_tools():
    copied = image_copies()
    missing = sorted(
        str(path.relative_to(ROOT))
        for path in image_closure()
        if not any(
            path.relative_to(ROOT).as_posix() == c or path.relative_to(ROOT).as_posix().startswith(c + "/") for c in copied
        )
    )
    assert missing == [], f"the image runs these but the Dockerfile does not COPY them: {missing}"
    tools = LAYERS[layer_of("scripts.verify") :]
    assert [path for path in copied for layer in tools for package in layer if path == package.replace(".", "/")] == []
    assert "." not in copied and "scripts" not in copied


@pytest.mark.parametrize("package", ["scripts.archive", "scripts.server", "scripts.container"])
def test_the_image_runs_the_product_packages(package):
    # what the image needs is found, not assumed: its commands reach these packages
    assert package in {package_of(module_of(path)) for path in image_closure()}
