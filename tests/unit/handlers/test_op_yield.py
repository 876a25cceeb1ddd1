"""Yield points between a background pass's operators (handlers/op_yield.py): after each operator of an exported graph
(points in the graph) or before every aten operator a torch model runs (a dispatch mode), the lane yields there while a
stream lane is busy, and its passes keep their full size."""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from handlers import op_yield
from handlers.lane_signal import LaneSignal
from handlers.model_files import load_program
from handlers.op_yield import GraphYield, OperatorYield
from handlers.settings import HandlerSettings
from handlers.yielding import FRESH_SPACING, YieldingPasses
from tests.unit.handlers.cpu_work import run_for


@pytest.fixture(autouse=True)
def each_yield_point_finds_the_thread_has_run(monkeypatch):
    """Each read of the thread's CPU clock finds it a second on, so the spacing of yields by the thread's run
    (test_op_yield.py gives that test a clock of its own) never holds one back here, however little CPU a pass takes."""
    ticks = itertools.count()
    monkeypatch.setattr("handlers.yielding.thread_cpu_s", lambda: float(next(ticks)))


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()


def aten_ops(model: torch.nn.Module, batch: torch.Tensor) -> list[str]:
    seen: list[str] = []

    class Record(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with torch.inference_mode(), Record():
        model(batch)
    return seen


@pytest.mark.parametrize("form", ["eager", "torchscript", "export"])
def test_a_yield_point_between_every_operator_of_each_torch_form_and_the_same_answer(form):
    model, batch = small_model(), torch.randn(8, 16)
    expected = model(batch)
    if form == "torchscript":
        model = torch.jit.trace(model, batch)
    elif form == "export":
        model = torch.export.export(model, (batch,)).module()
    operators = aten_ops(model, batch)
    assert len(operators) >= 3  # two products and a relu at least
    calls = []
    with torch.inference_mode(), OperatorYield(lambda: calls.append(1), check_ns=0) as mode:
        out = model(batch)
    assert len(calls) == mode.checks == len(operators)
    torch.testing.assert_close(out, expected)


def exported_flat(tmp_path, model: torch.nn.Module, batch: torch.Tensor):
    """`model` exported with a dynamic batch, saved and loaded as a bulk lane loads a .pt2 (its graph with points)."""
    program = torch.export.export(model, (batch,), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},))
    path = tmp_path / "m.pt2"
    torch.export.save(program, str(path))
    operators = [node for node in program.graph.nodes if isinstance(node.target, torch._ops.OpOverload)]
    return load_program(path, torch.device("cpu")), len(operators)


def test_a_loaded_exported_graph_has_a_point_after_each_operator_live_only_in_a_graph_yield(tmp_path):
    model, batch = small_model(), torch.randn(8, 16)
    expected = model(batch)
    flat, operators = exported_flat(tmp_path, model, batch)
    assert operators >= 3  # two products and a relu at least
    with torch.inference_mode():
        torch.testing.assert_close(flat(batch), expected)  # outside a pass that asked for them: inert
        calls = []
        with GraphYield(lambda: calls.append(1), check_ns=0) as points:
            out = flat(batch)
            torch.testing.assert_close(out, expected)
        assert len(calls) == points.checks == operators
        flat(batch)  # the pass ended: inert again
    assert len(calls) == operators


def test_graph_points_are_live_only_on_the_thread_whose_pass_asked_for_them(tmp_path):
    """A bulk worker's other pass thread, or a stream lane's batch in the same process, passes them without a check."""
    model, batch = small_model(), torch.randn(4, 16)
    flat, _ = exported_flat(tmp_path, model, batch)
    calls, other = [], []
    with torch.inference_mode(), GraphYield(lambda: calls.append(1), check_ns=0):
        side = threading.Thread(target=lambda: other.append(flat(batch)))
        side.start()
        side.join()
    assert calls == [] and len(other) == 1
    torch.testing.assert_close(other[0], model(batch))


def test_a_lane_with_graph_points_yields_between_an_exported_models_operators_on_its_pass_threads(tmp_path, monkeypatch):
    """The wiring: YieldingPasses.for_lane picks the graph's points for a .pt2, and the passes its pool threads run
    reach them (a rise held up is seen and yielded to between operators, its hold counted once a thread); no dispatch
    mode."""
    monkeypatch.setattr("handlers.op_yield.CHECK_NS", 0)
    monkeypatch.setattr("handlers.op_yield.OperatorYield.__enter__", lambda self: pytest.fail("dispatch mode entered"))
    yields = []
    monkeypatch.setattr("handlers.yielding.os.sched_yield", lambda: yields.append(1))
    model, batch = small_model(), torch.randn(32, 16)
    flat, operators = exported_flat(tmp_path, model, batch)
    settings = HandlerSettings.from_yaml({"handler": {"task": "digit_classification", "model_file": "m.pt2"}})
    stream = LaneSignal("cpu", tmp_path)
    stream.claim()
    yielding = YieldingPasses.for_lane(LaneSignal("cpu", tmp_path), settings, 8, on_cpu=True)
    assert yielding.points_in_graph
    reached = []
    inner = yielding._yield_within_pass
    monkeypatch.setattr(yielding, "_yield_within_pass", lambda: (reached.append(threading.get_ident()), inner()))

    def run(part):
        with torch.inference_mode():
            return list(flat(torch.stack(part)))

    with stream.raised(), ThreadPoolExecutor(2) as pool:
        results = yielding.run_pulled(list(batch), lambda row: 1, run, pool, 2, 8)
    torch.testing.assert_close(torch.stack(results), model(batch))
    assert len(reached) >= operators  # every pass reached its points
    assert threading.get_ident() not in reached  # on the pool's threads, where the passes ran
    stats = yielding.stats
    holds = len(stats.holds_s) + len(stats.holds_after_full_s)
    assert yields and 1 <= holds <= 2  # one rise, yielded to, counted once by each of the 2 pass threads at most
    assert op_yield._live == 0


def test_a_pass_that_fails_inside_its_graph_points_leaves_none_live(tmp_path):
    model, batch = small_model(), torch.randn(4, 16)
    flat, _ = exported_flat(tmp_path, model, batch)
    calls = []
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"), torch.inference_mode():
        with GraphYield(lambda: calls.append(1), check_ns=0):
            flat(torch.randn(4, 15))  # a wrong width fails in the first product
    assert op_yield._live == 0 and getattr(op_yield._active, "points", None) is None
    with torch.inference_mode():
        flat(batch)
    assert calls == []  # the points it left are inert


def test_the_signal_is_read_at_most_every_check_ns():
    model, batch = small_model(), torch.randn(8, 16)
    calls = []
    with torch.inference_mode(), OperatorYield(lambda: calls.append(1), check_ns=10**12):
        for _ in range(20):
            model(batch)
    assert calls == []  # not within 1,000 s of the pass's start


class RowTimedOps(torch.nn.Module):
    """Ten operators, each followed by 0.2 ms a row run on the thread's CPU (what the yield points time)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(10):
            x = x + 1
            run_for(0.0002 * len(x))
        return x


def run_rows(yielding: YieldingPasses, total: int, during) -> tuple[list[int], list[float]]:
    sizes, model = [], RowTimedOps()

    def run(part):
        sizes.append(len(part))
        with torch.inference_mode():
            return model(torch.tensor(part, dtype=torch.float32)).tolist()

    side = threading.Thread(target=during)
    side.start()
    try:
        results = yielding.run(list(range(total)), lambda row: 1, run)
    finally:
        side.join()
    return sizes, results


@pytest.fixture(autouse=True)
def _dispatch_warmed():
    """A process's first operator under a dispatch mode takes a second (torch's lazy set-up): not a pass's time."""
    with torch.inference_mode(), OperatorYield(lambda: None):
        torch.ones(1) + 1


@pytest.mark.parametrize("served_just_before", [True, False])
def test_a_rise_during_a_full_pass_is_seen_at_the_next_operator_while_stream_lanes_serve(tmp_path, served_just_before):
    """With a stream batch within the last second, a full pass has yield points and sees a rise an operator later;
    a job with no stream traffic around runs without them (no cost) and sees it at the pass's end."""
    stream = LaneSignal("cpu", tmp_path)
    stream.claim()
    if served_just_before:
        with stream.raised():
            pass
    yielding = YieldingPasses(LaneSignal("cpu", tmp_path), 16, on_cpu=True, pass_s=0.001, between_operators=True)

    def raise_during_the_first_pass():
        time.sleep(0.010)  # a full pass of 16 rows takes 10 x 3.2 ms
        with stream.raised():
            time.sleep(0.2)

    sizes, results = run_rows(yielding, 64, raise_during_the_first_pass)
    assert results == [row + 10.0 for row in range(64)]
    if served_just_before:  # seen an operator (about 3.2 ms) after it, not at the end of the 32 ms pass
        assert len(yielding.stats.holds_s) == 1 and yielding.stats.holds_after_full_s == []
    else:  # at the pass's end, about 22 ms after it
        assert yielding.stats.holds_s == [] and len(yielding.stats.holds_after_full_s) == 1
    assert yielding.stats.yielded_s > 0


def test_while_raised_a_pass_is_sized_by_its_longest_operator_not_its_whole_time(tmp_path):
    """A bound of 2 ms: an operator of 0.2 ms a row fits about 10 rows, a whole pass (ten of them) one."""
    stream = LaneSignal("cpu", tmp_path)
    stream.claim()
    kinds = {}
    for between in (False, True):
        yielding = YieldingPasses(LaneSignal("cpu", tmp_path), 16, on_cpu=True, pass_s=0.002, between_operators=between)
        with stream.raised():
            sizes, results = run_rows(yielding, 80, lambda: None)
        assert results == [row + 10.0 for row in range(80)]
        kinds[between] = sizes
    assert max(kinds[False]) == 1, kinds  # whole passes of 2 ms a row: one row (the least)
    assert max(kinds[True]) > 1, kinds  # learned from the operators: more than one row


class WaitsBetweenOps(torch.nn.Module):
    """Operators that take microseconds, with a 5 ms wait between two of them (a wait for the GIL or a core)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 1
        time.sleep(0.005)
        return x * 2


def test_a_stretch_between_operators_counts_what_the_thread_ran_not_its_waits():
    model, calls, x = WaitsBetweenOps(), [], torch.ones(4)
    started = time.perf_counter()
    with torch.inference_mode(), OperatorYield(lambda: calls.append(1), check_ns=0) as points:
        out = model(x)
    assert out.tolist() == [4.0] * 4
    assert time.perf_counter() - started > 0.005
    assert len(calls) == 2  # a point before each operator
    assert points.longest_stretch_s() < 0.003  # the 5 ms wait ran next to nothing


@pytest.mark.parametrize(
    ("model_file", "between", "on_cpu", "expected"),
    [
        ("m.pt2", True, True, True),
        ("m.torchscript.pt", True, True, True),
        ("m.onnx", True, True, False),  # ONNX Runtime's operators are not torch's: passes are cut
        ("m.aoti.pt2", True, True, False),  # nor AOTInductor's compiled kernels
        ("m.pt2", False, True, False),
        ("m.pt2", True, False, False),  # a GPU runs kernels asynchronously: passes are cut and waited
    ],
)
def test_the_lane_yields_between_operators_only_where_torch_runs_them_on_the_cpu(tmp_path, model_file, between, on_cpu, expected):
    settings = HandlerSettings.from_yaml(
        {"handler": {"task": "digit_classification", "model_file": model_file, "yield_between_operators": between}}
    )
    yielding = YieldingPasses.for_lane(LaneSignal("cpu", tmp_path), settings, 64, on_cpu)
    assert yielding.between_operators is expected
    # A torch.export program's points are in its graph (load_program puts them there); TorchScript's, a dispatch mode's.
    assert yielding.points_in_graph is (expected and model_file == "m.pt2")


def test_yield_between_operators_given_as_null_is_the_default_true():
    settings = HandlerSettings.from_yaml(
        {"handler": {"task": "digit_classification", "model_file": "m.pt2", "yield_between_operators": None}}
    )
    assert settings.yield_between_operators is True


def test_an_unknown_yield_between_operators_value_is_refused():
    with pytest.raises(ValueError, match="handler.yield_between_operators must be true or false, got 'yes'"):
        handler = {"task": "digit_classification", "model_file": "m.pt2", "yield_between_operators": "yes"}
        HandlerSettings.from_yaml({"handler": handler})


def test_between_operators_the_lane_yields_once_for_each_stream_batch_not_at_every_operator(tmp_path, monkeypatch):
    """A batch that keeps the signal up gets the core once: yielding again at every operator after it gave that batch
    nothing and starved the job (a 32-row minilm job ran past its 600 s timeout in CI's soak). A batch that starts
    later gets its own yield."""
    yields = []
    monkeypatch.setattr("handlers.yielding.os.sched_yield", lambda: yields.append(1))
    cpu = [10.0]
    monkeypatch.setattr("handlers.yielding.thread_cpu_s", lambda: cpu[0])
    stream = LaneSignal("cpu", tmp_path)
    stream.claim()
    yielding = YieldingPasses(LaneSignal("cpu", tmp_path), 16, on_cpu=True, pass_s=0.001, between_operators=True)
    yielding._yield_within_pass()
    assert yields == []  # nothing raised: no yield
    with stream.raised():
        for _ in range(50):
            cpu[0] += 0.001  # each operator runs 1 ms: the spacing below is not what holds these back
            yielding._yield_within_pass()
        assert len(yields) == 1
    time.sleep(0.001)  # the next batch's rise has a later clock
    with stream.raised():
        for _ in range(50):
            cpu[0] += 0.001
            yielding._yield_within_pass()
    assert len(yields) == 2
    assert len(yielding.stats.holds_s) == 2  # each batch's hold is counted once


def test_on_the_cpu_a_thread_yields_at_most_once_for_each_pass_s_it_has_run(tmp_path, monkeypatch):
    """A yield gives up the thread's time slice (under EEVDF its deadline moves a slice on), so a thread that the
    stream lanes keep waiting must still run between yields: pass_s between passes while the same batches run, half
    of it (FRESH_SPACING) for a batch that started since its last yield. Yield points reached sooner are passed, the
    batch's rise stays unseen and is yielded to (and its hold counted) once the thread has run that long."""
    yields = []
    monkeypatch.setattr("handlers.yielding.os.sched_yield", lambda: yields.append(1))
    cpu = [5.0]  # seconds, in steps a float holds exactly
    monkeypatch.setattr("handlers.yielding.thread_cpu_s", lambda: cpu[0])
    stream = LaneSignal("cpu", tmp_path)
    stream.claim()
    yielding = YieldingPasses(LaneSignal("cpu", tmp_path), 16, on_cpu=True, pass_s=1.0, between_operators=True)
    fresh = FRESH_SPACING * 1.0  # what a thread runs before it yields to a batch it has not yielded to
    assert 0 < fresh < 1.0
    with stream.raised():
        assert yielding._yield_if_busy(False) is True
        assert len(yields) == 1
    time.sleep(0.001)
    with stream.raised():  # a new batch while the thread has run half that since its yield: no yield yet
        cpu[0] += fresh / 2
        assert yielding._yield_if_busy(True) is True
        yielding._yield_within_pass()
        assert len(yields) == 1
        assert len(yielding.stats.holds_s) == 0
        cpu[0] += fresh / 2  # enough for a new batch
        yielding._yield_within_pass()
        assert len(yields) == 2
        assert len(yielding.stats.holds_s) == 1
        cpu[0] += fresh  # the same batch still running: between passes the thread yields after a whole pass_s
        assert yielding._yield_if_busy(True) is True
        assert len(yields) == 2
        cpu[0] += 1.0 - fresh
        assert yielding._yield_if_busy(True) is True
        assert len(yields) == 3
        assert len(yielding.stats.holds_s) == 1  # that batch's hold was counted at its first yield
    # Not on the CPU (a GPU lane waits for the signal instead): no spacing by the thread's CPU time.
    device = YieldingPasses(LaneSignal("cpu", tmp_path), 16, on_cpu=False, pass_s=0.002, max_wait_s=0.0)
    for _ in range(2):
        time.sleep(0.001)
        with stream.raised():
            assert device._yield_if_busy(True) is True
    assert len(device.stats.holds_s) == 2  # the CPU clock did not move between them
    assert len(yields) == 3


def test_a_hold_on_the_cpu_is_what_the_thread_ran_after_the_rise_at_most_the_wall_clock_since_it(tmp_path, monkeypatch):
    """How long a pass thread kept its core after a stream batch started: its run time from its last read of the
    signal before the rise (an upper bound) to its yield, and never more than the wall clock since the rise. A thread
    the stream threads or its sibling's GIL kept waiting held no core meanwhile: its hold is what it ran."""
    monkeypatch.setattr("handlers.yielding.os.sched_yield", lambda: None)
    ran = [100.0]
    monkeypatch.setattr("handlers.yielding.hold_cpu_s", lambda: ran[0])
    monkeypatch.setattr("handlers.yielding.thread_cpu_s", lambda: ran[0])  # the spacing: the same run, read apart
    stream = LaneSignal("cpu", tmp_path)
    stream.claim()
    yielding = YieldingPasses(LaneSignal("cpu", tmp_path), 16, on_cpu=True, pass_s=0.001, between_operators=True)
    yielding._yield_within_pass()  # a read with nothing raised, at run time 100 s
    with stream.raised():
        time.sleep(0.05)  # 50 ms on the wall clock, of which the thread ran 0.25 ms
        ran[0] += 0.00025
        yielding._yield_within_pass()
    assert yielding.stats.holds_s == [pytest.approx(0.00025)]
    yielding.stats.take()
    ran[0] += 30.0  # a long stretch without a read: the bound from the last read is loose ...
    with stream.raised():
        yielding._yield_within_pass()
    assert len(yielding.stats.holds_s) == 1 and 0 <= yielding.stats.holds_s[0] < 1.0  # ... the wall clock bounds it


def test_each_pass_thread_yields_to_a_batch_and_counts_its_hold_once(tmp_path, monkeypatch):
    """Each pass thread holds a core of its own, so each yields to a stream batch, once, and counts its own hold."""
    yields = []
    monkeypatch.setattr("handlers.yielding.os.sched_yield", lambda: yields.append(threading.get_ident()))
    stream = LaneSignal("cpu", tmp_path)
    stream.claim()
    yielding = YieldingPasses(LaneSignal("cpu", tmp_path), 16, on_cpu=True, pass_s=0.001, between_operators=True)
    with stream.raised(), ThreadPoolExecutor(2) as pool:
        both = threading.Barrier(2)

        def operators() -> int:
            both.wait()  # two threads, not one pool thread twice
            for _ in range(3):
                yielding._yield_within_pass()
            return threading.get_ident()

        threads = {future.result() for future in [pool.submit(operators) for _ in range(2)]}
    assert len(threads) == 2 and sorted(yields) == sorted(threads)  # one yield each, not one for the lane
    assert len(yielding.stats.holds_s) == 2


def test_a_batch_that_ends_before_the_thread_yields_to_it_still_counts_its_hold(tmp_path, monkeypatch):
    """A thread still inside its spacing (or a long operator) when a short stream batch ends kept its core through
    the batch: its hold is counted when the thread next reads the signal, not dropped for want of a yield."""
    yields = []
    monkeypatch.setattr("handlers.yielding.os.sched_yield", lambda: yields.append(1))
    ran = [100.0]
    monkeypatch.setattr("handlers.yielding.hold_cpu_s", lambda: ran[0])
    monkeypatch.setattr("handlers.yielding.thread_cpu_s", lambda: ran[0])
    stream = LaneSignal("cpu", tmp_path)
    stream.claim()
    yielding = YieldingPasses(LaneSignal("cpu", tmp_path), 16, on_cpu=True, pass_s=1.0, between_operators=True)
    with stream.raised():
        yielding._yield_within_pass()  # the first batch: yielded to
    assert len(yields) == 1 and len(yielding.stats.holds_s) == 1
    time.sleep(0.001)
    with stream.raised():
        time.sleep(0.01)  # the batch runs 10 ms on the wall clock ...
        ran[0] += 0.003  # ... of which the thread ran 3 ms, still inside its spacing: no yield
        yielding._yield_within_pass()
        assert len(yields) == 1 and len(yielding.stats.holds_s) == 1
    ran[0] += 0.002
    yielding._yield_within_pass()  # the batch has ended: its hold is what the thread ran since its read before it
    assert len(yields) == 1
    assert yielding.stats.holds_s[1:] == [pytest.approx(0.005)]
