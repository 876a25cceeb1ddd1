"""Static check: no code that serves or handles requests ever unpickles (handlers/, scripts/, models/).

Read with Python's ast, not grep, so comments and docstrings that mention pickle do not count and
keyword arguments are seen. Allowed, and why:
- torch.load only with weights_only=True (torch's restricted unpickler: tensors and containers);
- numpy.load without allow_pickle=True (numpy's default refuses object arrays);
- yaml.safe_load only;
- torch.jit.load (TorchScript): its archive's pickle is read by TorchScript's own unpickler, which
  resolves TorchScript types only and calls no Python callables;
- torch.export.load, which can unpickle (handlers/pickle_guard.py says where), only in a function that
  first calls refuse_pickles on the file, or at build time in models/ on the file that build just wrote.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from scripts.layout import ROOT

SCANNED = ("handlers", "scripts", "models")
GENERATED = ("scripts/clients/grpc_stubs",)
UNPICKLING_MODULES = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "joblib", "marshal", "shelve", "jsonpickle"}
FORBIDDEN_CALLS = {"read_pickle", "unsafe_load", "full_load", "Unpickler"}
# Build-time readers of the program the same build exported a moment before (never a served file).
BUILD_TIME_EXPORT_LOADS = {"models/digits/formats.py", "models/export_formats.py", "models/minilm/export.py"}


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return ""


def keyword(call: ast.Call, name: str):
    for item in call.keywords:
        if item.arg == name:
            return item.value.value if isinstance(item.value, ast.Constant) else "<expression>"
    return None


def problems_in(source: str, relative: str) -> list[str]:
    """Every unpickling call or import in one module, as 'path:line: what'."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        where = f"{relative}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"{where}: imports {name}" for name in names if name.split(".")[0] in UNPICKLING_MODULES]
        elif isinstance(node, ast.FunctionDef):
            found += _export_loads(node, where, relative)
        elif isinstance(node, ast.Call):
            found += _call_problem(node, where)
    return found


def _call_problem(call: ast.Call, where: str) -> list[str]:
    name = dotted(call.func)
    last = name.rsplit(".", 1)[-1]
    root = name.split(".")[0]
    if root in UNPICKLING_MODULES or last in FORBIDDEN_CALLS:
        return [f"{where}: calls {name}"]
    if name == "torch.load" and keyword(call, "weights_only") is not True:
        return [f"{where}: torch.load without weights_only=True"]
    if last == "load" and root in ("np", "numpy") and keyword(call, "allow_pickle") not in (None, False):
        return [f"{where}: numpy.load with allow_pickle"]
    if name == "yaml.load":
        return [f"{where}: yaml.load (use yaml.safe_load)"]
    return []


def _export_loads(function: ast.FunctionDef, where: str, relative: str) -> list[str]:
    """torch.export.load in `function` must come after a refuse_pickles call in the same function."""
    calls = sorted((node for node in ast.walk(function) if isinstance(node, ast.Call)), key=lambda c: (c.lineno, c.col_offset))
    guarded = False
    found = []
    for call in calls:
        name = dotted(call.func)
        guarded = guarded or name.endswith("refuse_pickles")
        if name == "torch.export.load" and not guarded and relative not in BUILD_TIME_EXPORT_LOADS:
            found.append(f"{relative}:{call.lineno}: torch.export.load without refuse_pickles first (in {function.name})")
    return found


def scanned_files() -> list[Path]:
    files = [path for folder in SCANNED for path in sorted((ROOT / folder).rglob("*.py"))]
    return [path for path in files if not str(path.relative_to(ROOT)).startswith(GENERATED)]


def test_no_served_code_unpickles():
    files = scanned_files()
    assert len(files) > 50 and ROOT / "handlers" / "model_files.py" in files
    problems = [problem for path in files for problem in problems_in(path.read_text(), str(path.relative_to(ROOT)))]
    assert problems == []


def test_the_model_loader_guards_its_torch_export_load():
    source = (ROOT / "handlers" / "model_files.py").read_text()
    assert "torch.export.load(" in source
    assert problems_in(source, "handlers/model_files.py") == []
    unguarded = source.replace("refuse_pickles(path)", "pass")
    assert [problem.split(": ", 1)[1] for problem in problems_in(unguarded, "handlers/model_files.py")] == [
        "torch.export.load without refuse_pickles first (in load_program)"
    ]


@pytest.mark.parametrize(
    "line",
    [
        "import pickle",
        "from dill import loads",
        "data = pickle.loads(body)",
        "model = torch.load(path)",
        "model = torch.load(path, weights_only=False)",
        "array = np.load(path, allow_pickle=True)",
        "frame = pd.read_pickle(path)",
        "config = yaml.load(text)",
        "config = yaml.unsafe_load(text)",
        "value = joblib.load(path)",
    ],
)
def test_the_check_finds_each_way_to_unpickle(line):
    assert len(problems_in(line, "example.py")) == 1


@pytest.mark.parametrize(
    "line",
    [
        "weights = torch.load(path, weights_only=True)",
        "array = np.load(path)",
        "config = yaml.safe_load(text)",
        "module = torch.jit.load(path)",
        '"""Loading exported models without pickle."""',
    ],
)
def test_the_check_lets_safe_readers_pass(line):
    assert problems_in(line, "example.py") == []
