import pytest

from handlers.settings import HandlerSettings


def test_reads_handler_section_and_keeps_task_options():
    settings = HandlerSettings.from_yaml(
        {"handler": {"task": "image_classification", "model_file": "m.pt2", "max_batch_rows": 8, "precision": "bf16", "tokenizer": "t.json"}}
    )
    assert (settings.max_batch_rows, settings.precision, settings.deterministic) == (8, "bf16", False)
    assert settings.task_options == {"tokenizer": "t.json"}


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        (None, "no 'handler:' section"),
        ({"model_file": "m.pt2"}, "handler.task is required"),
        ({"task": "x", "model_file": "m", "max_batch_rows": 0}, "max_batch_rows must be a positive integer, got 0"),
        ({"task": "x", "model_file": "m", "max_batch_rows": "8"}, "got '8'"),
        ({"task": "x", "model_file": "m", "precision": "int4"}, "one of fp32, bf16, fp16, got 'int4'"),
        ({"task": "x", "model_file": "m", "deterministic": "yes"}, "deterministic must be true or false"),
    ],
)
def test_rejects_bad_settings_with_a_message_that_says_what_is_allowed(handler, message):
    with pytest.raises(ValueError, match=message):
        HandlerSettings.from_yaml({"handler": handler} if handler is not None else {})
