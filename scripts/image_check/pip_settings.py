"""pip's settings on this machine, carried into an image build without writing a path of it into the repository.

`pip config list` gives what pip here would use (files and PIP_* variables); the build gets the same as one
/etc/pip.conf, and every local file or folder those settings name (wheels, local indexes, constraints, the CA
bundle) mounted read-only at the same path. Nothing here is specific to one machine: a machine without
such settings gets an empty pip.conf and no mounts.
"""

from __future__ import annotations

import ast
import ssl
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from scripts.errors import ConfigError

# What `pip install` reads, weakest first: [global], then [install], then PIP_* variables (":env:").
SECTIONS = ("global", "install", ":env:")
# PEP 503 layout: index pages under <root>/simple link to files beside it (../../files/...).
SIMPLE = "simple"


@dataclass(frozen=True)
class PipSettings:
    options: dict[str, str]

    def conf_text(self) -> str:
        lines = ["# the building machine's pip settings, mounted into the build only (scripts/image_check/pip_settings.py)"]
        lines.append("[global]")
        return "\n".join(lines + [f"{key} = {value}" for key, value in sorted(self.options.items())]) + "\n"

    def local_paths(self) -> list[Path]:
        """The files and folders the settings name that exist here, outermost only (a folder covers its content)."""
        found = {path for value in self.options.values() for path in named_paths(value) if path.exists()}
        return sorted(path for path in found if not any(other in path.parents for other in found))


def parse_config_list(text: str) -> dict[str, str]:
    """`pip config list` output (section.key='value' lines) merged as `pip install` would see it."""
    by_section: dict[str, dict[str, str]] = {section: {} for section in SECTIONS}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not sep or not dot or section not in by_section:
            continue
        by_section[section][key] = str(ast.literal_eval(value))
    merged: dict[str, str] = {}
    for section in SECTIONS:
        merged.update(by_section[section])
    return merged


def named_paths(value: str) -> list[Path]:
    """Local paths in one setting's value (whitespace-separated paths or file:// URLs), as the build must see them."""
    paths = []
    for token in value.split():
        if token.startswith("file://"):
            path = Path(unquote(urlsplit(token).path))
            paths.append(path.parent if path.name == SIMPLE else path)
        elif token.startswith("/"):
            paths.append(Path(token))
    return paths


def read_pip_settings(python: str = sys.executable) -> PipSettings:
    try:
        listing = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        raise ConfigError(f"`{python} -m pip config list` failed: {error}") from None
    return PipSettings(parse_config_list(listing.stdout))


def ca_bundle() -> Path | None:
    """The CA bundle this machine's TLS clients trust (where TLS is intercepted, the interceptor's root is in it)."""
    cafile = ssl.get_default_verify_paths().cafile
    return Path(cafile) if cafile and Path(cafile).is_file() else None
