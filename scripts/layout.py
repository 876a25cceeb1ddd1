"""Where things are in this repository: every script and test imports these paths from here."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config.properties"
KEY_FILE = ROOT / "key_file.json"
MODEL_STORE = ROOT / "model_store"
BUILD = ROOT / "build"
JSON = "application/json"
