"""TorchServe's parts stand apart (handlers/torchserve/): the core, the tasks and the shared decoders import neither
TorchServe's own package (`ts`) nor the adapter, so they read, and run, as model code alone (batch jobs in process,
the GPU check, the benches' peers serve the same core without TorchServe)."""

from __future__ import annotations

import ast
from pathlib import Path

HANDLERS = Path(__file__).resolve().parents[3] / "handlers"
ADAPTER = HANDLERS / "torchserve"


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (imports inside functions too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_nothing_outside_handlers_torchserve_imports_torchserve_or_its_adapter():
    core = [path for path in HANDLERS.rglob("*.py") if ADAPTER not in path.parents]
    assert len(core) > 20 and HANDLERS / "core.py" in core and HANDLERS / "tasks" / "base.py" in core
    strays = {
        f"{path.relative_to(HANDLERS.parent)}: {name}"
        for path in core
        for name in imported(path)
        if name == "ts" or name.startswith(("ts.", "handlers.torchserve"))
    }
    assert not strays, f"move what these need out of handlers/torchserve/ (or into it): {sorted(strays)}"


def test_the_check_sees_an_import_of_the_adapter(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from handlers.torchserve.metrics import x\n    import ts.version\n")
    assert {"handlers.torchserve.metrics", "ts.version"} <= imported(source)
