"""One reader of a built .mar: its manifest (model name and version), its model-config.yaml, its files."""

from __future__ import annotations

import contextlib
import json
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from handlers.settings import HandlerSettings
from scripts.errors import ArchiveError

MANIFEST = "MAR-INF/MANIFEST.json"
MODEL_CONFIG = "model-config.yaml"


@dataclass(frozen=True)
class MarFile:
    """A model archive on disk, opened to read; every method raises ArchiveError naming what is wrong."""

    path: Path

    def manifest(self) -> dict[str, Any]:
        """The manifest's `model` section (modelName, modelVersion, handler, ...)."""
        try:
            return json.loads(self.read(MANIFEST))["model"]
        except (KeyError, ValueError) as error:
            raise ArchiveError(f"{self.path} is not a model archive with {MANIFEST} ({error})") from None

    @property
    def model_name(self) -> str:
        return str(self.manifest().get("modelName", ""))

    @property
    def version(self) -> str:
        return str(self.manifest().get("modelVersion", ""))

    def model_config(self) -> dict[str, Any]:
        """model-config.yaml as a dict: TorchServe's top-level keys and the handler: section."""
        return yaml.safe_load(self.read(MODEL_CONFIG)) or {}

    def settings(self) -> HandlerSettings:
        return HandlerSettings.from_yaml(self.model_config())

    def read(self, name: str) -> bytes:
        try:
            with zipfile.ZipFile(self._existing()) as mar:
                return mar.read(name)
        except zipfile.BadZipFile as error:
            raise ArchiveError(f"{self.path} is not a model archive ({error}): rebuild it with `make archive`") from None
        except KeyError:
            raise ArchiveError(f"{self.path} has no {name}: rebuild it with `make archive`") from None

    @contextlib.contextmanager
    def unpacked(self) -> Iterator[Path]:
        """The archive's files in a temporary folder, removed afterwards."""
        with tempfile.TemporaryDirectory(prefix="mar-") as folder, zipfile.ZipFile(self._existing()) as mar:
            mar.extractall(folder)
            yield Path(folder)

    def _existing(self) -> Path:
        if not self.path.is_file():
            raise ArchiveError(f"archive {self.path} not found: build it with `make archive`")
        return self.path
