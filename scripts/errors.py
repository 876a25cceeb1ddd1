"""Typed errors of the scripts: library code raises them, only a command's main() turns them into an exit status."""

from __future__ import annotations


class ScriptError(Exception):
    """A problem the user can act on; the message says what was wrong and what to do."""


class ConfigError(ScriptError):
    """config.properties, key_file.json or the machine's set-up is not what the scripts need."""


class ArchiveError(ScriptError):
    """A .mar is missing, unreadable or not the archive that was asked for."""


class ServerError(ScriptError):
    """TorchServe did not start, answer or stop as expected."""
