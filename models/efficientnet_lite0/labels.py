"""Write imagenet_classes.json, ImageNet-1k's 1000 class names in the model's output order, from torchvision's wheel.

    python -m models.efficientnet_lite0.labels --wheel /path/to/torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl

torchvision's list (torchvision/models/_meta.py, _IMAGENET_CATEGORIES) is the one its classifiers answer with.
It is read out of the wheel as a literal (the zip opened, the module parsed, never imported or run), and the
names are committed, so neither building nor serving needs torchvision.
"""

from __future__ import annotations

import ast
import json
import zipfile
from pathlib import Path

from scripts import cli
from scripts.errors import ArchiveError

LABELS_FILE = Path(__file__).resolve().parent / "imagenet_classes.json"
META_MODULE = "torchvision/models/_meta.py"
CATEGORIES = "_IMAGENET_CATEGORIES"
CLASSES = 1000


def categories_from_wheel(wheel: Path) -> list[str]:
    """The 1000 names of `wheel`'s torchvision/models/_meta.py, checked: strings, unique, 1000 of them."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            source = archive.read(META_MODULE).decode("utf-8")
    except (OSError, KeyError, zipfile.BadZipFile) as error:
        raise ArchiveError(f"cannot read {META_MODULE} from {wheel}: {error}") from None
    return categories_in(source, str(wheel))


def categories_in(source: str, where: str) -> list[str]:
    """The 1000 names of a torchvision/models/_meta.py's text (`where` names it in errors), checked."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == CATEGORIES for target in node.targets):
            names = ast.literal_eval(node.value)
            break
    else:
        raise ArchiveError(f"{where}: {META_MODULE} has no {CATEGORIES} list")
    if len(names) != CLASSES or len(set(names)) != CLASSES or not all(isinstance(name, str) and name for name in names):
        raise ArchiveError(f"{where}: {CATEGORIES} is not {CLASSES} unique names (got {len(names)}, {len(set(names))} unique)")
    return names


def write(names: list[str], path: Path = LABELS_FILE) -> Path:
    path.write_text(json.dumps(names, indent=0, ensure_ascii=False) + "\n")
    return path


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--wheel", type=Path, required=True, help="a torchvision wheel (any platform's)")
    parser.add_argument("--out", type=Path, default=LABELS_FILE)
    args = parser.parse_args()
    path = write(categories_from_wheel(args.wheel), args.out)
    print(f"{CLASSES} ImageNet class names -> {path}")
    return 0


if __name__ == "__main__":
    cli.run(main)
