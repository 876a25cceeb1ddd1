"""docs/benchmarks.md's generated regions (scripts/bench/report.py): a benchmark rewrites its own marked region
and nothing else, and the goals its tables check come from scripts/bench/targets.json."""

from __future__ import annotations

from models import registry
from scripts.bench.report import REPORT, TARGETS, replace_section

PAGE = """# Benchmarks

Hand-written: how to read the tables.

<!-- stream bench: begin -->
old stream table
<!-- stream bench: end -->

## How it measures

Hand-written too.
"""


def test_a_run_rewrites_its_own_region_and_keeps_the_hand_written_text(tmp_path):
    report = tmp_path / "benchmarks.md"
    report.write_text(PAGE)
    replace_section("stream bench", "new stream table\n", report)
    assert report.read_text() == PAGE.replace("old stream table", "new stream table")


def test_a_region_seen_for_the_first_time_is_appended_and_the_others_stay(tmp_path):
    report = tmp_path / "benchmarks.md"
    report.write_text(PAGE)
    replace_section("batch-job bench", "batch table", report)
    replace_section("batch-job bench", "batch table, second run", report)
    assert (
        report.read_text() == PAGE + "\n<!-- batch-job bench: begin -->\nbatch table, second run\n<!-- batch-job bench: end -->\n"
    )


def test_a_new_models_region_goes_after_the_regions_it_follows(tmp_path):
    report = tmp_path / "benchmarks.md"
    report.write_text(PAGE)
    replace_section("stream bench: b", "model b", report, after=("stream bench", "stream bench: a"))
    replace_section("stream bench: a", "model a", report, after=("stream bench",))
    text = report.read_text()
    first = text.index("<!-- stream bench: end -->")
    assert first < text.index("model a") < text.index("model b") < text.index("## How it measures")
    replace_section("stream bench: c", "model c", report, after=("stream bench", "stream bench: a", "stream bench: b"))
    assert text.index("model b") < report.read_text().index("model c") < report.read_text().index("## How it measures")


def test_the_committed_report_has_each_benchmarks_region_once():
    text = REPORT.read_text()
    regions = [f"{section}: {model}" for section in ("stream bench", "field targets") for model in registry.models()]
    for name in ("field targets", "peer sweeps", "batch-job bench", "bulk lanes", "stream bench", *regions):
        assert (text.count(f"<!-- {name}: begin -->"), text.count(f"<!-- {name}: end -->")) == (1, 1), name


def test_the_goals_come_from_each_models_folder_and_the_batch_goals_from_the_targets_file():
    assert TARGETS["batch"] == {"bulk_over_in_process": 0.95, "in_process_over_ceiling": 0.9}
    assert set(TARGETS) == {"_about", "batch"}  # no model named here: each folder holds its own goals
    for found in registry.models().values():
        assert found.bench["stream_goals"] and found.bench["field_goals"], found.name
    digits = registry.model("digits").bench
    assert digits["stream_goals"]["p99_top_ms"] == 40
    assert digits["field_goals"] == {"rate_over_best_peer_top": 1.0, "p99_over_best_peer_top": 1.0, "p50_over_best_peer_ms": 1.5}
    # the classifier's goal (issue 32): its stream lane ahead of every peer at 64 connections
    classifier = registry.model("efficientnet_lite0").bench
    assert classifier["field_goals"]["rate_over_best_peer_top"] == 1.0
    assert classifier["stream_goals"]["rate_over_flask_top"] == 1.0
