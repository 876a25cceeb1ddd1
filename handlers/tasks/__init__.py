"""Task registry: a model kind is added by adding a task here, not by editing the core."""
from __future__ import annotations

from handlers.settings import HandlerSettings
from handlers.tasks.image_classification import ImageClassification
from handlers.tasks.text_embedding import TextEmbedding

TASKS = {
    ImageClassification.name: ImageClassification,
    TextEmbedding.name: TextEmbedding,
}


def build_task(settings: HandlerSettings):
    try:
        task_class = TASKS[settings.task]
    except KeyError:
        raise ValueError(f"unknown handler.task {settings.task!r}; known tasks: {', '.join(sorted(TASKS))}") from None
    return task_class(settings)
