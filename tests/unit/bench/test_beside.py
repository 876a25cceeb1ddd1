"""The 'Live traffic beside a batch job' section: the targets' ratios and verdicts from a run's figures."""

from __future__ import annotations

from functools import partial

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scripts.bench import beside
from scripts.bench.beside import (
    CONDITIONS,
    QUICK,
    HoldResult,
    JobLoop,
    ModelResult,
    Plan,
    Point,
    holds_section,
    loads,
    main,
    section,
    targets,
)
from scripts.bench.report import replace_section


def run(beside_p99: float, job_beside: float) -> ModelResult:
    result = ModelResult("digits", capacity_rps=1000.0, job_alone={"bulk lane job": 1000.0, "in-process job": 900.0})
    result.baseline_rps = 1010.0
    result.jobs_checked = 2
    for load in loads(QUICK):
        for condition in CONDITIONS[1:]:
            alone = Point(load, "alone", 2.0, 4.0, 500.0, 0, stream_cpu_share=0.5, machine_busy=0.6, paired=condition)
            result.points.append(alone)
            result.points.append(Point(load, condition, 2.1, beside_p99, 480.0, 0, job_rps=job_beside, machine_busy=1.0))
    return result


def verdicts(result: ModelResult) -> dict[str, tuple[float, bool]]:
    return {what: (round(ratio, 3), met) for what, ratio, _, met in targets(result, QUICK)}


def test_the_latency_targets_compare_beside_with_alone_at_each_load_the_issue_names():
    got = verdicts(run(beside_p99=4.4, job_beside=450.0))
    assert got["digits p99 beside a bulk lane job / alone, c=4"] == (1.1, True)
    assert got["digits p50 beside a bulk lane job / alone, 50%"] == (1.05, True)
    assert "digits p99 beside a bulk lane job / alone, 25%" not in got  # the open loop target is at 50% only
    assert verdicts(run(beside_p99=5.2, job_beside=450.0))["digits p99 beside a bulk lane job / alone, c=16"] == (1.3, False)


def test_the_job_is_held_to_what_the_traffic_left_and_its_cost_to_the_rate_with_the_mechanism_off():
    got = verdicts(run(beside_p99=4.0, job_beside=450.0))
    # 450 rows/s beside a lane that used half the machine alone: 450 / (1000 x 0.5).
    assert got["digits job beside c=1 / (its rate alone x (1 - 0.50))"] == (0.9, True)
    assert got["digits job alone / the same with the mechanism off"] == (0.99, True)
    short = verdicts(run(beside_p99=4.0, job_beside=400.0))
    assert short["digits job beside 75% / (its rate alone x (1 - 0.50))"] == (0.8, False)


def test_the_section_has_a_row_per_load_every_verdict_and_the_hold_figures_a_region_of_their_own():
    text = section([run(beside_p99=4.4, job_beside=450.0)], QUICK, quick=True)
    assert text.startswith("## Live traffic beside a batch job")
    assert text.count("| c=") == 3 and "| 50% |" in text
    assert "| digits p99 beside a bulk lane job / alone, c=1 | 1.10 | ≤ 1.2 | met |" in text
    assert "| digits job alone / the same with the mechanism off | 0.99 | ≥ 0.97 | met |" in text
    checked = "Finished jobs checked (a short one per condition, to its end beside 4 connections): 2, every row exactly once."
    assert checked in text
    assert "How long a bulk lane keeps the CPU" not in text  # its own region: --holds-only reruns it alone
    wake = {"nothing beside": [0.1], "bulk core at normal": [2.0], "bulk core at idle": [0.2]}
    held = holds_section([HoldResult("digits", [0.2, 0.4], [3.0], wake), HoldResult("minilm", [0.5, 1.2], [], wake)])
    assert held.startswith("### How long a bulk lane keeps the CPU")
    assert "| digits | 0.400 / 0.400 / 0.400 (2) | met | 3.000 / 3.000 / 3.000 (1) |" in held
    assert "| minilm | 1.200 / 1.200 / 1.200 (2) | missed | none (0) |" in held  # the longest near traffic, over 1 ms


def test_holds_only_rewrites_the_holds_region_and_leaves_the_rest_of_the_report(tmp_path, monkeypatch):
    report = tmp_path / "benchmarks.md"
    report.write_text("# Benchmarks\n\n<!-- bench:beside: begin -->\nthe section\n<!-- bench:beside: end -->\n\nhand text\n")
    monkeypatch.setattr("scripts.bench.beside.replace_section", partial(replace_section, report=report))
    wake = {"nothing beside": [0.1], "bulk core at normal": [2.0], "bulk core at idle": [0.2]}
    monkeypatch.setattr("scripts.bench.beside.holds", lambda model, plan: HoldResult(model, [0.3], [], wake))
    monkeypatch.setattr("scripts.bench.beside.bench_model", lambda *args: pytest.fail("no stream lane runs"))
    assert main(["--holds-only", "--models", "digits"]) == 0
    written = report.read_text()
    assert "<!-- bench:beside: begin -->\nthe section\n<!-- bench:beside: end -->" in written
    assert written.index("bench:beside: end") < written.index("bench:beside-holds: begin") < written.index("hand text")
    assert "| digits | 0.300 / 0.300 / 0.300 (1) | met | none (0) |" in written


def test_a_cell_is_the_mean_of_its_runs_and_beside_is_held_to_the_alone_runs_between_its_own():
    result = run(beside_p99=4.4, job_beside=450.0)
    # A second round at c=1: the machine slower for both, alone and beside it.
    result.points.append(Point("c=1", "alone", 4.0, 8.0, 300.0, 1, stream_cpu_share=0.7, paired="bulk lane job"))
    result.points.append(Point("c=1", "bulk lane job", 4.2, 8.8, 280.0, 0, job_rps=350.0))
    alone, beside = result.point("c=1", "alone"), result.point("c=1", "bulk lane job")
    assert (alone.p50_ms, alone.p99_ms, alone.rps, alone.errors) == (3.0, 6.0, 400.0, 1)
    assert round(alone.stream_cpu_share, 3) == 0.6 and (round(beside.p99_ms, 3), beside.job_rps) == (6.6, 400.0)
    assert result.point("c=1", "alone", "in-process job").p50_ms == 2.0  # the in-process job's own alone runs
    assert verdicts(result)["digits p99 beside a bulk lane job / alone, c=1"] == (1.1, True)


def test_the_rows_done_stand_while_a_finished_job_has_removed_its_progress_before_the_loop_counts_it(tmp_path):
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "instance": [1, 2, 3]}), source)
    loop = JobLoop("digits", source, tmp_path, [])  # not entered: no job runs
    output = loop.folder / "digits-job-0.parquet"
    progress = output.with_name(output.name + ".progress.json")
    loop._output = output
    progress.write_bytes(orjson.dumps({"rows_done": 2}))
    assert loop.rows_done() == 2
    progress.unlink()  # the job finished: its progress file goes first
    assert loop.rows_done() == 2


def test_a_bulk_lane_jobs_rate_is_timed_by_the_rows_its_lane_answered_not_by_the_rows_it_committed(tmp_path, monkeypatch):
    """A paused job's chunks in flight are answered while it is stopped and committed all at once when it resumes: its
    commits would count them in the turn after. Its server lane's own count is read instead; an in-process job, which
    computes nothing while stopped, is timed by its commits."""
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "instance": [1, 2, 3]}), source)
    scraped = {("HandlerBatchRows_sum", "digits-bulk"): 500.0, ("HandlerBatchRows_sum", "digits"): 70.0}
    monkeypatch.setattr(beside, "scrape", lambda server: scraped)
    lane = JobLoop("digits", source, tmp_path, [], answered=partial(beside.lane_rows, object(), "digits-bulk"))
    in_process = JobLoop("digits", source, tmp_path, [])
    for loop in (lane, in_process):  # each has just resumed and committed 8,000 rows answered while it was stopped
        loop._output = loop.folder / "digits-job-0.parquet"
        loop._output.with_name(loop._output.name + ".progress.json").write_bytes(orjson.dumps({"rows_done": 8000}))
    assert (lane.rows_answered(), lane.rows_done()) == (500.0, 8000)
    assert in_process.rows_answered() == 8000
    monkeypatch.setattr(beside.time, "sleep", lambda seconds: scraped.update({("HandlerBatchRows_sum", "digits-bulk"): 900.0}))
    clock = iter([10.0, 12.0])
    monkeypatch.setattr(beside.time, "monotonic", lambda: next(clock))
    assert beside.job_alone(lane, 2.0) == 200.0  # (900 - 500) rows answered in 2 s, whatever it committed


def test_the_jobs_alone_take_turns_in_an_order_reversed_every_other_round(monkeypatch):
    """The job and the same job with the mechanism off: A B, B A, A B, B A. In a fixed order the first always ran right
    after the set-up or the other's drain."""
    monkeypatch.setattr(beside, "wait_idle", lambda pids: None)
    turns: list[str] = []

    class Job:
        def __init__(self, name: str) -> None:
            self.name, self.rows = name, 0

        def pause(self) -> None:
            pass

        def resume(self) -> None:
            turns.append(self.name)

        def rows_answered(self) -> int:  # each reading 100 (120) rows on: a turn's two readings differ by that
            self.rows += 100 if self.name == "on" else 120
            return self.rows

    jobs = {"on": Job("on"), "off": Job("off")}
    rates = beside.alternate_alone(jobs, {"on": list, "off": list}, Plan(job_seconds=0.04, repeats=4))
    assert turns[:8] == ["on", "off", "off", "on", "on", "off", "off", "on"]
    assert turns[8:] == ["on", "off"]  # both left running at the end
    assert rates["on"] > 0 and rates["off"] > rates["on"]
