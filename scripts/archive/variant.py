"""A copy of a built .mar with some `handler:` settings changed: same weights, same code, other settings.

    python -m scripts.archive.variant model_store/digits.mar build/digits-deterministic.mar deterministic=true

Used by `make verify` to serve the deterministic mode without retraining or touching the default archive.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

import yaml

from handlers.settings import HandlerSettings
from scripts import cli
from scripts.archive.reader import MODEL_CONFIG, MarFile


def write_variant(source: Path, target: Path, handler: dict[str, Any], top: dict[str, Any] | None = None) -> Path:
    """Copy `source` to `target`, replacing the listed keys of model-config.yaml's handler section and, from
    `top`, TorchServe's own top-level keys (e.g. sequenceBatching for a stateful lane)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(target.name + ".tmp")
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as new:
        for entry in old.infolist():
            data = old.read(entry)
            if entry.filename == MODEL_CONFIG:
                data = _changed_config(data, handler, top or {})
            new.writestr(entry, data)
    os.replace(temporary, target)
    MarFile(target).record_digest()  # registering checks it; callers that register check the source's first
    return target


def _changed_config(data: bytes, handler: dict[str, Any], top: dict[str, Any]) -> bytes:
    config = yaml.safe_load(data) or {}
    if "handler" in top:
        raise ValueError("top-level changes may not replace the handler section; pass its keys as `handler`")
    config.update(top)
    config["handler"] = {**config.get("handler", {}), **handler}
    HandlerSettings.from_yaml(config)  # refuse to write an archive the handler would reject at start-up
    return yaml.safe_dump(config, sort_keys=False).encode("utf-8")


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("settings", nargs="+", help="KEY=VALUE, the value read as YAML (true, 256, bf16)")
    args = parser.parse_args()
    changes = {}
    for item in args.settings:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"expected KEY=VALUE, got {item!r}")
        changes[key] = yaml.safe_load(value)
    print(f"wrote {write_variant(args.source, args.target, changes)}")
    return 0


if __name__ == "__main__":
    cli.run(main)
