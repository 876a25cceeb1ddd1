"""The names a PromQL query reads and a /metrics page exports (scripts/server/prometheus.py)."""

from __future__ import annotations

from scripts.server.prometheus import exported_names, metric_names


def test_metric_names_skip_functions_labels_keywords_numbers_and_grafana_variables():
    expr = (
        'histogram_quantile(0.99, sum by (lane, le) (rate(HandlerLatencySeconds_bucket{lane=~"$lane",code!="5xx"}'
        "[$__rate_interval]))) / 1e6 > on (lane) group_left lane:latency_objective_seconds or vector(1) unless up"
    )
    assert metric_names(expr) == {"HandlerLatencySeconds_bucket", "lane:latency_objective_seconds", "up"}


def test_exported_names_split_samples_from_declared_families():
    page = (
        "# HELP HandlerForwardSeconds Torchserve prometheus histogram metric with unit: s\n"
        "# TYPE HandlerForwardSeconds histogram\n"
        "# TYPE HandlerErrors counter\n"
        'HandlerErrors{model="digits",lane="digits",code="400",Hostname="vm",} 1.0\n'
        "# TYPE HandlerOOMSplits counter\n"
    )
    samples, declared = exported_names(page)
    assert samples == {"HandlerErrors"}
    assert declared == {"HandlerForwardSeconds_bucket", "HandlerForwardSeconds_sum", "HandlerForwardSeconds_count"} | {
        "HandlerErrors",
        "HandlerOOMSplits",
    }
