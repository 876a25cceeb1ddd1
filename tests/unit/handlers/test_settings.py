import pytest
import yaml

from handlers.errors import SettingsError
from handlers.settings import HandlerSettings
from handlers.tasks import build_task
from scripts.layout import ROOT


def test_reads_handler_section_and_keeps_task_options():
    settings = HandlerSettings.from_yaml(
        {
            "handler": {
                "task": "digit_classification",
                "model_file": "m.pt2",
                "max_batch_rows": 8,
                "precision": "bf16",
                "tokenizer": "t.json",
            }
        }
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
        ({"task": "x", "model_file": "m", "precision": "int4"}, "one of fp32, bf16, fp16, int8, got 'int4'"),
        ({"task": "x", "model_file": "m", "deterministic": "yes"}, "deterministic must be true or false"),
        (
            {"task": "x", "model_file": "m", "torch_threads": 0},
            "torch_threads must be a positive integer or \\{lane: positive integer or null\\}, got 0",
        ),
        (
            {"task": "x", "model_file": "m", "torch_threads": {"digits": True}},
            "torch_threads must be a positive integer or \\{lane: positive integer or null\\}, got \\{'digits': True\\}",
        ),
        (
            {"task": "x", "model_file": "m", "max_request_rows": {"digits": 0}},
            "max_request_rows must be a positive integer or \\{lane: positive integer or null\\}, got \\{'digits': 0\\}",
        ),
        ({"task": "x", "model_file": "m", "max_request_rows": "1024"}, "max_request_rows must be a positive integer"),
        ({"task": "x", "model_file": "m", "mmap_threshold_mib": {"digits-bulk": 0}}, "mmap_threshold_mib must be a positive"),
        (
            {"task": "x", "model_file": "m", "mmap_threshold_mib": {"default": 4, "digits-bulk": 64}},
            "mmap_threshold_mib is at most 32 \\(glibc's limit\\), got \\{'default': 4, 'digits-bulk': 64\\}",
        ),
        (
            {"task": "x", "model_file": "m", "max_batch_tokens": {"default": 1024, "minilm-bulk": 0}},
            "max_batch_tokens must be a positive integer or \\{lane: positive integer or null\\}, "
            "got \\{'default': 1024, 'minilm-bulk': 0\\}",
        ),
    ],
)
def test_rejects_bad_settings_with_a_message_that_says_what_is_allowed(handler, message):
    with pytest.raises(ValueError, match=message):
        HandlerSettings.from_yaml({"handler": handler} if handler is not None else {})


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        (
            {"task": "digit_classification", "model_file": "m.pt2", "max_batch_row": 8},
            "unknown key\\(s\\) max_batch_row for task digit_classification; allowed keys: "
            "task, model_file, max_batch_rows, max_batch_tokens, precision, deterministic, torch_threads, max_request_rows, "
            "max_request_bytes, response_timeout_s, fast_protocol, mmap_threshold_mib, heap_slack_mib, forward_passes, priority, "
            "yield_pass_ms, yield_linger_ms, yield_between_operators, max_image_pixels, max_request_pixels$",
        ),
        (
            {"task": "text_embedding", "model_file": "m.pt2", "tokenizer": "t.json"},
            "unknown key\\(s\\) tokenizer for task text_embedding; allowed keys: .*max_text_bytes, pad_to_multiple$",
        ),
        ({"task": "text_embedding", "model_file": "m.pt2", "tokenizer_file": 3}, "handler.tokenizer_file must be str, got 3"),
        (
            {"task": "text_embedding", "model_file": "m.pt2", "max_text_bytes": 0},
            "handler.max_text_bytes must be a positive integer",
        ),
        ({"task": "digit_classification", "model_file": "m.pt2", "max_image_pixels": -1}, "max_image_pixels must be a positive"),
        ({"task": "digit_classification", "model_file": "m.pt2", "max_image_pixels": 1e6}, "max_image_pixels must be int"),
        (
            {"task": "nope", "model_file": "m.pt2"},
            "unknown handler.task 'nope'; known tasks: digit_classification, image_classification, text_embedding",
        ),
    ],
)
def test_build_task_refuses_unknown_keys_and_tasks_at_start_up(handler, message):
    with pytest.raises(SettingsError, match=message):
        build_task(HandlerSettings.from_yaml({"handler": handler}))


def test_build_task_gives_each_task_its_typed_options():
    task = build_task(
        HandlerSettings.from_yaml({"handler": {"task": "text_embedding", "model_file": "m.pt2", "max_seq_length": 128}})
    )
    assert (task.tokenizer_file, task.max_seq_length) == ("tokenizer.json", 128)


def test_torch_threads_are_set_for_all_lanes_or_per_lane():
    def settings(threads):
        return HandlerSettings.from_yaml({"handler": {"task": "x", "model_file": "m", "torch_threads": threads}})

    assert settings(2).threads_for("digits-bulk") == 2
    per_lane = settings({"default": 1, "digits-bulk": None})
    assert [per_lane.threads_for(lane) for lane in ("digits", "digits-seq", "digits-bulk")] == [1, 1, None]
    assert settings({"digits": 1}).threads_for("digits-bulk") is None


def test_forward_passes_are_one_unless_set_and_null_means_one_per_cpu():
    def settings(**handler):
        return HandlerSettings.from_yaml({"handler": {"task": "x", "model_file": "m", **handler}})

    assert settings().passes_for("digits-bulk") == 1
    per_lane = settings(forward_passes={"default": 1, "digits-bulk": None, "other": 3})
    assert [per_lane.passes_for(lane) for lane in ("digits", "digits-bulk", "other")] == [1, None, 3]
    for bad in (0, True, {"digits-bulk": 0}):
        with pytest.raises(SettingsError, match="handler.forward_passes must be a positive integer"):
            settings(forward_passes=bad)


def test_the_digits_archive_runs_passes_side_by_side_on_its_bulk_lane_only():
    config = yaml.safe_load((ROOT / "models" / "digits" / "model-config.yaml").read_text())
    per_lane = HandlerSettings.from_yaml(config)
    assert [per_lane.passes_for(lane) for lane in ("digits", "digits-seq", "digits-bulk")] == [1, 1, None]
    assert [per_lane.threads_for(lane) for lane in ("digits", "digits-bulk")] == [1, 1]


def test_mmap_threshold_is_set_per_lane_and_unset_means_the_handlers_default():
    def settings(mib):
        return HandlerSettings.from_yaml({"handler": {"task": "x", "model_file": "m", "mmap_threshold_mib": mib}})

    assert settings(None).mmap_threshold_bytes("digits") is None
    per_lane = settings({"default": 4, "digits-bulk": 32})
    lanes = ("digits", "digits-seq", "digits-bulk")
    assert [per_lane.mmap_threshold_bytes(lane) for lane in lanes] == [4 * 2**20, 4 * 2**20, 32 * 2**20]


def test_heap_slack_is_set_per_lane_and_unset_means_one_mmap_threshold():
    def settings(mib):
        return HandlerSettings.from_yaml({"handler": {"task": "x", "model_file": "m", "heap_slack_mib": mib}})

    assert settings(None).heap_slack_bytes("digits") is None
    per_lane = settings({"default": 96, "digits-bulk": None})
    assert [per_lane.heap_slack_bytes(lane) for lane in ("digits", "digits-bulk")] == [96 * 2**20, None]
    with pytest.raises(SettingsError, match="heap_slack_mib must be a positive"):
        settings({"digits": 0})


def test_row_limits_are_set_for_all_lanes_or_per_lane_and_name_the_lanes_that_take_more():
    def settings(rows):
        return HandlerSettings.from_yaml({"handler": {"task": "x", "model_file": "m", "max_request_rows": rows}})

    assert settings(None).rows_for("digits") is None and settings(None).named_lanes_rows() == {}
    assert settings(100).rows_for("digits-bulk") == 100
    per_lane = settings({"default": 1024, "digits-bulk": None})
    assert [per_lane.rows_for(lane) for lane in ("digits", "digits-seq", "digits-bulk")] == [1024, 1024, None]
    assert per_lane.named_lanes_rows() == {"digits-bulk": None}


def test_max_batch_rows_per_lane_resolves_for_the_lane_read_for():
    """A stream lane passes few rows at a time (a worker's peak memory), a bulk lane many (its throughput)."""
    handler = {"task": "x", "model_file": "m", "max_batch_rows": {"default": 16, "minilm-bulk": 64}}
    assert HandlerSettings.from_yaml({"handler": handler}, "minilm-bulk").max_batch_rows == 64
    assert HandlerSettings.from_yaml({"handler": handler}, "minilm").max_batch_rows == 16
    assert HandlerSettings.from_yaml({"handler": handler}).max_batch_rows == 16  # in process: the default
    assert HandlerSettings.from_yaml({"handler": {**handler, "max_batch_rows": 32}}, "minilm-bulk").max_batch_rows == 32


@pytest.mark.parametrize("rows", [{"minilm-bulk": 64}, {"default": 16, "minilm-bulk": None}, {"default": 0}, {"default": "8"}])
def test_max_batch_rows_per_lane_needs_a_default_and_positive_integers(rows):
    with pytest.raises(SettingsError, match="max_batch_rows"):
        HandlerSettings.from_yaml({"handler": {"task": "x", "model_file": "m", "max_batch_rows": rows}}, "minilm")


def test_max_batch_tokens_per_lane_resolves_for_the_lane_read_for():
    handler = {"task": "x", "model_file": "m", "max_batch_tokens": {"default": 1024, "minilm-bulk": None}}
    assert HandlerSettings.from_yaml({"handler": handler}, "minilm").max_batch_tokens == 1024
    assert HandlerSettings.from_yaml({"handler": handler}, "minilm-bulk").max_batch_tokens is None
    assert HandlerSettings.from_yaml({"handler": handler}).max_batch_tokens == 1024  # in process: the default entry
    assert HandlerSettings.from_yaml({"handler": {"task": "x", "model_file": "m"}}, "minilm").max_batch_tokens is None
