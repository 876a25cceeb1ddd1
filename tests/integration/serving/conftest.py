"""Fixtures of the serving tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def servers(request):
    """The session's servers, started only for the models the selected cases need."""
    return {model: request.getfixturevalue(f"{model}_server") for model in ("digits", "minilm")}
