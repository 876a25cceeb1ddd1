"""Per-model test parameters split between `make test` and `make test-slow` (.ci/run runs both): a test that costs
tens of seconds a model runs the first model of models/ (digits, the smallest) in make test and every other model
in make test-slow, so make test stays within its budget as models are added."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from models import registry


def first_fast_others_slow(names: Iterable[str]) -> list:
    """`names` as parameters: the first model of models/ as it is, the others marked slow."""
    first = next(iter(registry.models()))
    return [name if name == first else pytest.param(name, marks=pytest.mark.slow) for name in names]
