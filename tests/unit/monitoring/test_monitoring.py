"""monitoring/: the alert rules pass `promtool check rules` and their own `promtool test rules`; the dashboard and the
rules read only metrics that monitoring/metrics.yaml declares (the integration test checks the running server)."""

from __future__ import annotations

import json
import subprocess

import yaml

from scripts.server.prometheus import ALERTS, DASHBOARD, MONITORING, binary, dashboard_queries, metric_names

SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("",), "gauge": ("",)}


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary("promtool")), *args], cwd=MONITORING, capture_output=True, text=True, timeout=120)


def test_alert_rules_are_valid():
    result = promtool("check", "rules", ALERTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_alert_rules_fire_on_their_test_series():
    result = promtool("test", "rules", "alerts.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def declared_series() -> set[str]:
    """Series names as TorchServe 0.12 exports the families of monitoring/metrics.yaml (counters keep their name)."""
    config = yaml.safe_load((MONITORING / "metrics.yaml").read_text())
    return {
        metric["name"] + suffix
        for section in ("ts_metrics", "model_metrics")
        for kind, entries in config[section].items()
        for metric in entries
        for suffix in SUFFIXES[kind]
    }


def test_every_dashboard_panel_has_a_query_and_every_query_reads_declared_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    assert all(panel.get("targets") for panel in dashboard["panels"] if panel["type"] != "row")
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for topic in ("p99", "throughput", "batch", "queue", "stage", "errors", "gpu memory"):
        assert topic in titles, topic
    queries = dashboard_queries()
    assert len(queries) > 20
    unknown = {query: metric_names(query) - declared_series() for query in queries}
    assert not {query: names for query, names in unknown.items() if names}


def test_alert_rules_read_declared_metrics_or_their_own_records():
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    records = {rule["record"] for rule in rules if "record" in rule}
    names = set().union(*(metric_names(rule["expr"]) for rule in rules))
    assert names - records - declared_series() == set()
    alerts = {rule["alert"] for rule in rules if "alert" in rule}
    assert {"LaneLatencyP99OverObjective", "LaneServerErrors", "LaneWorkerRestarted", "LaneQueueTimeHigh"} <= alerts
    assert "LaneGPUMemoryNearLimit" in alerts
