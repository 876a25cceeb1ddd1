"""The task contract (handlers/tasks/base.py): one base class, its hooks declared, tasks found by name."""

from __future__ import annotations

import jsonschema
import orjson
import pytest

from handlers.tasks import TASKS
from handlers.tasks.base import Task
from models import registry


class Rows(Task):
    """A task that implements only what is required (its name is not registered: it has none)."""

    def load_model(self, model_path, device):
        return None

    def decode_raw(self, body):
        return body

    def decode_instance(self, item):
        return item

    def collate(self, rows, pad_to):
        return list(rows)

    def forward(self, model, batch):
        return batch

    def unbatch(self, outputs, rows):
        return list(outputs)


def test_every_module_of_handlers_tasks_is_a_task_found_by_its_name():
    assert {"digit_classification", "text_embedding"} <= set(TASKS)
    for name, task in TASKS.items():
        assert issubclass(task, Task) and task.name == name and task.raw_media
    assert "Rows" not in {task.__name__ for task in TASKS.values()}


def test_the_optional_hooks_have_the_cores_defaults():
    task = Rows(options=None)
    assert task.for_request() is task
    assert task.decode_many([[1], [2]]) is None
    assert task.row_cost("anything") == 1
    assert task.GRAPH_EXAMPLE_ITEM is None and task.max_seq_length is None and task.raw_media == ()


def test_a_task_without_a_required_hook_cannot_be_built_and_says_which():
    class NoForward(Task):
        load_model = decode_raw = decode_instance = collate = unbatch = Rows.forward

    with pytest.raises(TypeError, match="abstract method.*forward"):
        NoForward(options=None)


def test_two_tasks_of_one_name_are_refused():
    with pytest.raises(TypeError, match="two tasks are named 'text_embedding'"):
        type("Imposter", (Rows,), {"name": "text_embedding"})
    assert TASKS["text_embedding"].__module__ == "handlers.tasks.text_embedding"


def test_a_named_task_without_its_request_bodies_is_refused():
    with pytest.raises(TypeError, match="task 'silent' declares no request_bodies"):
        type("Silent", (Rows,), {"name": "silent"})
    assert "silent" not in Task.registered


@pytest.mark.parametrize("name", sorted(registry.models()))
def test_every_models_samples_are_valid_request_bodies_of_its_task(name):
    found = registry.model(name)
    task = TASKS[found.task]
    schema = task.request_bodies["application/json"]
    jsonschema.Draft4Validator.check_schema(schema)  # OpenAPI 3.0's schemas are a JSON Schema draft 4 dialect
    body = orjson.loads(orjson.dumps({"instances": list(found.samples().instances)}))
    jsonschema.Draft4Validator(schema, format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER).validate(body)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(schema).validate({"instances": []})
    # Every raw media type the task declares is one its decoder takes (raw_media prefixes).
    raw = [media for media in task.request_bodies if media != "application/json"]
    assert raw and all(media.startswith(task.raw_media) for media in raw)
