"""The tasks: each module here defines one Task subclass, found by its `name` (model-config.yaml's handler.task).
A model kind is added by adding a module here, not by editing the core or this file."""

from __future__ import annotations

import importlib
import pkgutil

from handlers.errors import SettingsError
from handlers.settings import HandlerSettings
from handlers.tasks.base import Task, read_options

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

TASKS: dict[str, type[Task]] = Task.registered


def build_task(settings: HandlerSettings) -> Task:
    """The task named by handler.task, built from its typed options; refuses unknown tasks and keys."""
    try:
        task_class = TASKS[settings.task]
    except KeyError:
        raise SettingsError(f"unknown handler.task {settings.task!r}; known tasks: {', '.join(sorted(TASKS))}") from None
    return task_class(read_options(task_class.Options, settings.task_options, settings.task))
