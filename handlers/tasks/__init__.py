"""Task registry: a model kind is added by adding a task here, not by editing the core."""

from __future__ import annotations

from handlers.errors import SettingsError
from handlers.settings import HandlerSettings
from handlers.tasks.base import Task, read_options
from handlers.tasks.digits import DigitClassification
from handlers.tasks.text_embedding import TextEmbedding

TASKS: dict[str, type] = {
    DigitClassification.name: DigitClassification,
    TextEmbedding.name: TextEmbedding,
}


def build_task(settings: HandlerSettings) -> Task:
    """The task named by handler.task, built from its typed options; refuses unknown tasks and keys."""
    try:
        task_class = TASKS[settings.task]
    except KeyError:
        raise SettingsError(f"unknown handler.task {settings.task!r}; known tasks: {', '.join(sorted(TASKS))}") from None
    return task_class(read_options(task_class.Options, settings.task_options, settings.task))
