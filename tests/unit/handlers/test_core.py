"""The core with the real exported digits model: accuracy, micro-batching, regrouping, isolation, OOM."""

import threading
import time

import numpy as np
import pytest
import torch

from handlers.core import InferenceCore, StageTimes, select_device
from handlers.decoding import Payload
from handlers.errors import RequestError, SettingsError
from models.digits.samples import grid_png, held_out
from tests.unit.conftest import digits_settings


class RecordingModel(torch.nn.Module):
    """The real model, remembering the batch sizes it saw and raising torch's real OutOfMemoryError above `fits`
    rows, or whenever a batch holds a row whose pixels are all `MARK` (a row too large to fit even alone)."""

    def __init__(self, model, fits: int | None = None):
        super().__init__()
        self.model, self.fits, self.sizes = model, fits, []

    def forward(self, batch):
        self.sizes.append(batch.shape[0])
        if self.fits is not None and batch.shape[0] > self.fits:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        if (batch == MARK).flatten(1).all(dim=1).any():
            raise torch.OutOfMemoryError("CUDA out of memory (simulated, marked row)")
        return self.model(batch)


MARK = 13.0  # a digit grid never has every pixel at 13
MARKED = [[MARK] * 8] * 8


def instances(grids) -> Payload:
    return Payload(items=[g.tolist() for g in grids], raw=False)


def assert_same_predictions(actual, expected):
    assert [p["label"] for p in actual] == [p["label"] for p in expected]
    np.testing.assert_allclose([p["scores"] for p in actual], [p["scores"] for p in expected], atol=1e-6)


def core_with(digits_core, model, **settings) -> InferenceCore:
    return InferenceCore(digits_core.task, model, torch.device("cpu"), digits_settings(**settings))


def test_held_out_accuracy_is_at_least_97_percent(digits_core):
    grids, labels = held_out()
    [response] = digits_core.answer([instances(grids)])
    predicted = [p["label"] for p in response.body["predictions"]]
    assert response.status == 200 and response.rows == len(labels)
    assert np.mean(np.array(predicted) == labels) >= 0.97


def test_scores_are_ten_probabilities(digits_core):
    [response] = digits_core.answer([instances(held_out(3)[0])])
    for prediction in response.body["predictions"]:
        assert len(prediction["scores"]) == 10
        assert sum(prediction["scores"]) == pytest.approx(1.0, abs=1e-5)
        assert prediction["label"] == int(np.argmax(prediction["scores"]))


def test_rows_run_in_micro_batches_of_at_most_max_batch_rows_and_come_back_in_order(digits_core):
    grids, _ = held_out(50)
    model = RecordingModel(digits_core.model)
    core = core_with(digits_core, model, max_batch_rows=8)
    payloads = [instances(grids[:20]), Payload(items=[grid_png(grids[20])], raw=True), instances(grids[21:])]
    responses = core.answer(payloads)
    assert model.sizes == [8] * 6 + [2]
    [whole] = digits_core.answer([instances(grids)])
    expected = whole.body["predictions"]
    assert_same_predictions(responses[0].body["predictions"], expected[:20])
    assert responses[1].body["label"] == expected[20]["label"]  # a raw request gets one object back
    assert_same_predictions(responses[2].body["predictions"], expected[21:])


def test_a_bad_request_fails_alone_and_names_the_row(digits_core):
    grids, labels = held_out(3)
    bad = Payload(items=[grids[0].tolist(), [1] * 63], raw=False)
    responses = digits_core.answer([instances(grids[:1]), bad, Payload(items=[b"not an image"], raw=True), instances(grids[1:])])
    assert [r.status for r in responses] == [200, 400, 400, 200]
    assert responses[1].body == {
        "code": 400,
        "type": "InvalidInput",
        "message": "instances[1]: expected 64 values in 0..16 (or an 8x8 list), got 63",
    }
    assert "not a readable image" in responses[2].body["message"]
    assert [p["label"] for p in responses[3].body["predictions"]] == labels[1:].tolist()


def one_row_requests(grids) -> list[Payload]:
    """A stream batch: one request per grid, each a flat list of 64 numbers (what decode_many takes)."""
    return [Payload(items=[g.flatten().tolist()], raw=False) for g in grids]


def test_one_row_requests_are_decoded_together_and_answered_as_each_alone(digits_core, monkeypatch):
    grids, _ = held_out(6)
    alone = [digits_core.answer([payload])[0] for payload in one_row_requests(grids)]
    calls = []
    decode_many = digits_core.task.decode_many
    monkeypatch.setattr(digits_core.task, "decode_many", lambda items: calls.append(len(items)) or decode_many(items))
    together = digits_core.answer(one_row_requests(grids))
    assert calls == [6]  # one vectorised pass for the six requests
    assert [r.status for r in together] == [200] * 6
    for answer, reference in zip(together, alone, strict=True):
        assert_same_predictions(answer.body["predictions"], reference.body["predictions"])


def test_a_batch_of_more_rows_than_max_batch_rows_is_decoded_request_by_request(digits_core, monkeypatch):
    grids, _ = held_out(6)
    core = core_with(digits_core, digits_core.model, max_batch_rows=4)  # a bulk-sized batch for this core
    calls = []
    decode_many = core.task.decode_many
    monkeypatch.setattr(core.task, "decode_many", lambda items: calls.append(len(items)) or decode_many(items))
    responses = core.answer(one_row_requests(grids))
    assert calls == []  # no combined pass (each request is decoded by its own per-request decoder)
    assert [r.status for r in responses] == [200] * 6


def test_a_bad_value_among_requests_decoded_together_fails_only_its_own_request(digits_core):
    grids, _ = held_out(3)
    payloads = one_row_requests(grids)
    payloads.insert(1, Payload(items=[[1] * 63 + [17]], raw=False))
    responses = digits_core.answer(payloads)
    assert [r.status for r in responses] == [200, 400, 200, 200]
    assert responses[1].body["message"] == "instances[0]: expected 64 values in 0..16, got 17"
    alone = [digits_core.answer([payload])[0] for payload in one_row_requests(grids)]
    for answer, reference in zip([responses[0], *responses[2:]], alone, strict=True):
        assert_same_predictions(answer.body["predictions"], reference.body["predictions"])


def test_an_undecodable_request_passed_as_error_still_gets_its_own_answer(digits_core):
    responses = digits_core.answer([RequestError("empty request body"), instances(held_out(1)[0])])
    assert [r.status for r in responses] == [400, 200]


def answer_on_small_memory(digits_core, grids, fits: int):
    """`grids` as one request, max_batch_rows 16, on a model that runs out of memory above `fits` rows:
    (the model, which records the batch sizes it was given; the response; the stage times)."""
    model = RecordingModel(digits_core.model, fits=fits)
    stages = StageTimes()
    [response] = core_with(digits_core, model, max_batch_rows=16).answer([instances(grids)], stages)
    return model, response, stages


def test_out_of_memory_halves_the_micro_batch_and_still_answers_every_row(digits_core):
    grids, _ = held_out(20)
    model, response, stages = answer_on_small_memory(digits_core, grids, fits=4)
    [reference] = digits_core.answer([instances(grids)])
    assert response.status == 200
    assert_same_predictions(response.body["predictions"], reference.body["predictions"])
    assert model.sizes[:3] == [16, 8, 4] and max(model.sizes[3:]) <= 4
    assert stages.oom_splits == 2 and stages.forward_rows == [4] * 5  # only the passes that completed


def test_stage_times_cover_every_stage_and_forward_pass(digits_core):
    grids, _ = held_out(20)
    core = core_with(digits_core, digits_core.model, max_batch_rows=8)
    stages = StageTimes()
    responses = core.answer([instances(grids), instances(grids[:3]), RequestError("bad")], stages)
    assert [r.status for r in responses] == [200, 200, 400]
    assert stages.forward_rows == [8, 8, 7] and stages.oom_splits == 0
    assert all(value > 0 for value in (stages.decode, stages.collate, stages.forward, stages.encode))


def test_a_row_that_never_fits_is_a_507_for_its_own_request_and_the_core_keeps_working(digits_core):
    model = RecordingModel(digits_core.model, fits=0)
    core = core_with(digits_core, model, max_batch_rows=4)
    responses = core.answer([instances(held_out(2)[0]), RequestError("bad")])
    assert [r.status for r in responses] == [507, 400]
    assert responses[0].body == {
        "code": 507,
        "type": "OutOfResources",
        "message": "instances[0]: out of device memory for this row even alone; send it smaller",
    }
    model.fits = None
    assert core.answer([instances(held_out(2)[0])])[0].status == 200


def test_only_the_requests_holding_a_row_that_cannot_fit_fail_the_others_of_the_call_are_answered(digits_core):
    grids, labels = held_out(12)
    model = RecordingModel(digits_core.model)
    core = core_with(digits_core, model, max_batch_rows=8)
    payloads = [
        instances(grids[:3]),
        Payload(items=[grids[3].tolist(), MARKED, grids[4].tolist()], raw=False),  # row 1 never fits
        Payload(items=[grid_png(grids[5])], raw=True),
        Payload(items=[MARKED], raw=False),
        instances(grids[6:]),
    ]
    stages = StageTimes()
    responses = core.answer(payloads, stages)
    assert [r.status for r in responses] == [200, 507, 200, 507, 200]
    assert responses[1].body["message"].startswith("instances[1]: out of device memory for this row even alone")
    assert responses[3].body["message"].startswith("instances[0]: out of device memory")
    assert [p["label"] for p in responses[0].body["predictions"]] == labels[:3].tolist()
    assert responses[2].body["label"] == labels[5]
    assert [p["label"] for p in responses[4].body["predictions"]] == labels[6:].tolist()
    # 14 rows at 8: the first micro-batch holds both marked rows and is bisected down to them; every good row
    # ran, each marked row failed alone, and later micro-batches ran at the size that fitted.
    assert sum(stages.forward_rows) == 12 and stages.oom_splits >= 2
    assert model.sizes[0] == 8 and model.sizes.count(1) >= 2


def test_deterministic_mode_pads_to_the_current_step_so_a_split_really_shrinks_the_batch(digits_core):
    grids, _ = held_out(20)
    model = RecordingModel(digits_core.model, fits=4)
    core = core_with(digits_core, model, max_batch_rows=16, deterministic=True)
    [response] = core.answer([instances(grids)])
    # padded to 16, then 8, then 4 (not back to max_batch_rows, which could never fit)
    assert model.sizes[:3] == [16, 8, 4] and set(model.sizes[3:]) == {4}
    reference = core_with(digits_core, digits_core.model, max_batch_rows=4, deterministic=True)
    [expected] = reference.answer([instances(grids)])
    assert response.status == 200 and response.body == expected.body  # bitwise: same padded shape


def test_a_split_batch_learns_the_size_that_fits_for_the_rest_of_the_call(digits_core):
    grids, _ = held_out(40)
    model, response, stages = answer_on_small_memory(digits_core, grids, fits=5)
    assert response.status == 200 and len(response.body["predictions"]) == 40
    assert model.sizes[:3] == [16, 8, 4]  # 16 -> 8 -> 4 fits; then nothing above 4 is tried again
    assert max(model.sizes[3:]) == 4 and stages.oom_splits == 2 and sum(stages.forward_rows) == 40


def test_cpu_is_chosen_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert select_device(0) == torch.device("cpu") and select_device(None) == torch.device("cpu")


def test_inference_runs_under_inference_mode(digits_core):
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, batch):
            seen.append(torch.is_inference_mode_enabled())
            return digits_core.model(batch)

    core_with(digits_core, Probe()).answer([instances(held_out(1)[0])])
    assert seen == [True]


def test_int8_on_a_file_that_is_not_quantized_is_refused_at_start_up(digits_model_dir):
    with pytest.raises(SettingsError, match="int8 is built into the model file .* but digits.pt2 is fp32"):
        InferenceCore.load(digits_model_dir, digits_settings(precision="int8"), torch.device("cpu"))


class ThreadRecordingModel(RecordingModel):
    """Also remembers which thread ran each pass, and how many passes were running at once at most."""

    def __init__(self, model, fits: int | None = None):
        super().__init__(model, fits)
        self.threads, self.running, self.most = set(), 0, 0
        self.lock = threading.Lock()

    def forward(self, batch):
        with self.lock:
            self.threads.add(threading.current_thread().name)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(0.01)  # long enough for the other pass thread to start its own
            return super().forward(batch)
        finally:
            with self.lock:
                self.running -= 1


def test_passes_at_once_run_the_micro_batches_side_by_side_with_the_same_answers_in_order(digits_core):
    grids, _ = held_out(50)
    model = ThreadRecordingModel(digits_core.model)
    core = core_with(digits_core, model, max_batch_rows=8)
    assert core.run_passes_at_once(2) == 2
    stages = StageTimes()
    started = time.perf_counter()
    payloads = [instances(grids[:20]), Payload(items=[grid_png(grids[20])], raw=True), instances(grids[21:])]
    responses = core.answer(payloads, stages)
    wall = time.perf_counter() - started
    [whole] = digits_core.answer([instances(grids)])
    expected = whole.body["predictions"]
    assert_same_predictions(responses[0].body["predictions"], expected[:20])
    assert responses[1].body["label"] == expected[20]["label"]
    assert_same_predictions(responses[2].body["predictions"], expected[21:])
    assert sorted(model.sizes) == [2] + [8] * 6 and model.most == 2
    assert len(model.threads) == 2 and all(name.startswith("pass") for name in model.threads)
    assert sorted(stages.forward_rows) == [2] + [8] * 6
    # The passes' stage times are shares of the wall time they ran in, not the sum of both threads' times.
    assert 0 < stages.decode + stages.collate + stages.forward + stages.encode <= wall


def test_a_request_of_one_micro_batch_runs_on_the_calling_thread(digits_core):
    model = ThreadRecordingModel(digits_core.model)
    core = core_with(digits_core, model, max_batch_rows=8)
    core.run_passes_at_once(2)
    assert core.answer([instances(held_out(8)[0])])[0].status == 200
    assert model.threads == {threading.current_thread().name}


def test_out_of_memory_in_passes_at_once_still_halves_and_answers_every_row(digits_core):
    grids, _ = held_out(40)
    model = ThreadRecordingModel(digits_core.model, fits=5)
    core = core_with(digits_core, model, max_batch_rows=16)
    core.run_passes_at_once(2)
    stages = StageTimes()
    [response] = core.answer([instances(grids)], stages)
    [reference] = digits_core.answer([instances(grids)])
    assert response.status == 200
    assert_same_predictions(response.body["predictions"], reference.body["predictions"])
    assert sum(stages.forward_rows) == 40 and max(stages.forward_rows) <= 4 and stages.oom_splits == 2


def test_passes_at_once_are_for_the_cpu_only(digits_core):
    core = InferenceCore(digits_core.task, digits_core.model, torch.device("meta"), digits_settings())
    assert core.run_passes_at_once(4) == 1
    assert core_with(digits_core, digits_core.model).run_passes_at_once(1) == 1


def test_a_yielding_core_with_passes_at_once_pulls_its_slices_on_the_pass_threads_same_answers(digits_core, tmp_path):
    from handlers.lane_signal import LaneSignal
    from handlers.yielding import YieldingPasses

    grids, _ = held_out(40)
    model = ThreadRecordingModel(digits_core.model, fits=5)
    core = core_with(digits_core, model, max_batch_rows=16)
    core.run_passes_at_once(2)
    core.yielding = YieldingPasses(LaneSignal("cpu", tmp_path), 32, on_cpu=True)
    stages = StageTimes()
    [response] = core.answer([instances(grids)], stages)
    [reference] = digits_core.answer([instances(grids)])
    assert response.status == 200
    assert_same_predictions(response.body["predictions"], reference.body["predictions"])
    # Slices of 16, 16 and 8 rows, each halved on its own thread to what fits (5): every row once.
    assert sum(stages.forward_rows) == 40 and max(stages.forward_rows) <= 4 and stages.oom_splits >= 3
    assert model.threads and all(name.startswith("pass") for name in model.threads)
