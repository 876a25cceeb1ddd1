"""One reader of a built .mar: its manifest (model name and version), its model-config.yaml, its files,
and its recorded sha256.

`make archive` records each archive's sha256 next to it, in `<name>.mar.sha256` (sha256sum's format, so
`cd model_store && sha256sum -c digits.mar.sha256` checks it too). Registering (hot-swap, `make serve`)
refuses an archive whose digest is not recorded or differs: an archive is code (its handler runs in
every worker), so only what this repository built gets served.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
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
DIGEST_SUFFIX = ".sha256"


class DigestMismatch(ArchiveError):
    """An archive's sha256 is not recorded, or is not the one `make archive` recorded."""


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

    # -- digest ---------------------------------------------------------------------------------

    @property
    def digest_file(self) -> Path:
        """`<archive>.sha256`, next to the archive."""
        return self.path.with_name(self.path.name + DIGEST_SUFFIX)

    def sha256(self) -> str:
        digest = hashlib.sha256()
        with self._existing().open("rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()

    def record_digest(self) -> str:
        """Write the archive's sha256 next to it (what `make archive` does after building); returns it."""
        actual = self.sha256()
        self.digest_file.write_text(f"{actual}  {self.path.name}\n")
        return actual

    def copy(self, target: Path) -> MarFile:
        """The archive copied to `target`, with its recorded sha256 (if any) carried over to the copy's name."""
        shutil.copy2(self._existing(), target)
        copied = MarFile(target)
        recorded = self.recorded_digest()
        if recorded is not None:
            copied.digest_file.write_text(f"{recorded}  {target.name}\n")
        return copied

    def recorded_digest(self) -> str | None:
        """The hex digest in `<archive>.sha256` ("" for an empty file), None when there is no such file."""
        if not self.digest_file.is_file():
            return None
        fields = self.digest_file.read_text().split()
        return fields[0].lower() if fields else ""

    def verify_digest(self) -> str:
        """The archive's sha256, or DigestMismatch naming the archive, the recorded and the actual digest."""
        actual = self.sha256()
        expected = self.recorded_digest()
        if expected is None:
            raise DigestMismatch(
                f"{self.path.name} has no recorded sha256 ({self.digest_file.name} is missing; actual sha256 {actual}): "
                f"only archives built by `make archive` are served; rebuild it there"
            )
        if expected != actual:
            raise DigestMismatch(
                f"{self.path.name} does not match its recorded sha256: expected {expected or '(empty record)'}, "
                f"actual {actual} (changed since `make archive` built it); rebuild it or restore the built file"
            )
        return actual

    def _existing(self) -> Path:
        if not self.path.is_file():
            raise ArchiveError(f"archive {self.path} not found: build it with `make archive`")
        return self.path
