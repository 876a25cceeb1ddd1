"""Markers come from the folder: tests/unit -> unit, tests/integration -> integration."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.layout import ROOT


def pytest_collection_modifyitems(items):
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        if parts[0] in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, parts[0]))
