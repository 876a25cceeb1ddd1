"""podman as it runs on these machines: `--runtime runc` (crun refuses hybrid cgroups) and a containers.conf
with `default_ulimits = []` (raising rlimits is not permitted), passed through CONTAINERS_CONF."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from scripts.errors import ScriptError

CONTAINERS_CONF = "[containers]\n# no raised rlimits: not permitted in this sandbox\ndefault_ulimits = []\n"
INSTALL_HINT = "apt-get install podman runc mmdebstrap (.ci/run does)"


class ContainerError(ScriptError):
    """podman, the base, the image or the container did not do what was asked."""


def require_tools(*tools: str) -> None:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        raise ContainerError(f"{', '.join(missing)} not found: {INSTALL_HINT}")


@dataclass(frozen=True)
class Podman:
    conf: Path

    @classmethod
    def prepare(cls, folder: Path) -> Podman:
        require_tools("podman", "runc")
        folder.mkdir(parents=True, exist_ok=True)
        conf = folder / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        return cls(conf)

    def command(self, *args: str) -> list[str]:
        return ["podman", "--runtime", "runc", *args]

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def run(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A short podman command, its output captured; ContainerError with its stderr when it fails and `check`."""
        try:
            done = subprocess.run(self.command(*args), env=self.env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ContainerError(f"podman {' '.join(args[:2])} took over {timeout:.0f}s") from None
        if check and done.returncode != 0:
            raise ContainerError(f"podman {' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        return done

    def stream(self, *args: str, timeout: float) -> None:
        """A long podman command (a build) whose output goes to the terminal as it comes."""
        try:
            subprocess.run(self.command(*args), env=self.env, timeout=timeout, check=True)
        except subprocess.TimeoutExpired:
            raise ContainerError(f"podman {args[0]} took over {timeout:.0f}s") from None
        except subprocess.CalledProcessError as error:
            raise ContainerError(f"podman {args[0]} failed ({error.returncode}); its output is above") from None

    def image_exists(self, image: str) -> bool:
        return self.run("image", "exists", image, check=False).returncode == 0

    def inspect(self, kind: str, name: str) -> dict:
        return json.loads(self.run(kind, "inspect", name).stdout)[0]
