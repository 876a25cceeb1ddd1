"""A real Prometheus scraping a real TorchServe's metrics port while both digits lanes take concurrent traffic with
some bad requests: latency percentiles, rows/s, the batch-size distribution and the error rate through Prometheus's
HTTP API, the alert rules evaluating on the live series, and every metric the dashboard reads exported by the server.
Prometheus is stopped even when a test fails (scripts/server/prometheus.py)."""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import orjson
import pytest
import requests

from models.digits.samples import grid_png, held_out
from scripts.clients.load import send_concurrently
from scripts.server.prometheus import Prometheus, dashboard_queries, exported_names, metric_names, scraping

STREAM, BULK = "digits", "digits-bulk"
PNG, JSON = "image/png", "application/json"
STREAM_GOOD, STREAM_BAD, STREAM_CLIENTS = 160, 8, 16
BULK_GOOD, BULK_BAD, BULK_ROWS, BULK_CLIENTS = 12, 4, 30, 4  # 360 rows: the held-out digits
BAD_BODY = orjson.dumps({"instances": [[0] * 10]})  # 10 values instead of 64: a 400 for its request only

# Metrics the dashboard reads that a healthy CPU server declares (# TYPE) but has no sample of yet.
EXEMPT = {
    "HandlerGPUMemoryAllocatedMB": "CUDA lanes only: emitted after each batch on a GPU",
    "HandlerGPUMemoryReservedMB": "CUDA lanes only: emitted after each batch on a GPU",
    "HandlerGPUMemoryTotalMB": "CUDA lanes only: emitted when a worker starts on a GPU",
    "GPUMemoryUsed": "TorchServe's system metrics report GPUs only where there are some",
    "GPUMemoryUtilization": "TorchServe's system metrics report GPUs only where there are some",
    "GPUUtilization": "TorchServe's system metrics report GPUs only where there are some",
    "HandlerOOMSplits": "only after a CUDA out-of-memory",
    "Requests5XX": "only after a 5xx answer, which this traffic does not cause",
}


@dataclass
class LoadRun:
    prometheus: Prometheus
    before: dict
    after: dict
    metrics_text: str


def handler_requests(metrics_url: str) -> float:
    """The server's own count of requests its handlers answered, all lanes (for knowing when a scrape caught up)."""
    text = requests.get(metrics_url, timeout=30).text
    return sum(float(value) for value in re.findall(r"^HandlerBatchRequests_sum\{.*\} (\S+)$", text, re.MULTILINE))


def settled(prometheus: Prometheus, metrics_url: str) -> None:
    """Wait for a scrape that saw every request answered so far."""
    prometheus.wait_for(f"sum(HandlerBatchRequests_sum) >= {handler_requests(metrics_url)}")


def snapshot(prometheus: Prometheus) -> dict:
    """Counter totals as Prometheus last scraped them."""
    return {
        "stream_batches": prometheus.values(f'sum by (le) (HandlerBatchRequests_bucket{{lane="{STREAM}"}})', "le"),
        "requests": prometheus.values("sum by (lane) (HandlerBatchRequests_sum)", "lane"),
        "rows": prometheus.values("sum by (lane) (HandlerBatchRows_sum)", "lane"),
        "errors_400": prometheus.values('sum by (lane) (HandlerErrors{code="400"})', "lane"),
        "requests_4xx": prometheus.value("sum(Requests4XX)"),
    }


def mixed(good: list[bytes], good_kind: str, bad: int) -> tuple[list[bytes], list[str]]:
    """`good` bodies with `bad` bad ones spread among them, so they share TorchServe batches."""
    bodies, kinds = list(good), [good_kind] * len(good)
    for index in range(bad):
        position = (index + 1) * len(bodies) // (bad + 1)
        bodies.insert(position, BAD_BODY)
        kinds.insert(position, JSON)
    return bodies, kinds


@pytest.fixture(scope="module")
def load_run(digits_server, tmp_path_factory):
    endpoints = digits_server.endpoints
    metrics_url = f"{endpoints.metrics}/metrics"
    grids, _ = held_out()
    pngs = [grid_png(grid) for grid in grids[:STREAM_GOOD]]
    chunks = [orjson.dumps({"instances": grids[i * BULK_ROWS : (i + 1) * BULK_ROWS].tolist()}) for i in range(BULK_GOOD)]
    with scraping(endpoints.metrics, tmp_path_factory.mktemp("prometheus")) as prometheus:
        # Warm-up: every series the assertions read exists before the baseline (a counter born inside a rate()
        # window would hide its first increase).
        send_concurrently(endpoints, STREAM, [pngs[0], BAD_BODY], [PNG, JSON], clients=1)
        send_concurrently(endpoints, BULK, [chunks[0], BAD_BODY], [JSON, JSON], clients=1)
        settled(prometheus, metrics_url)
        before = snapshot(prometheus)
        stream = mixed(pngs, PNG, STREAM_BAD)
        bulk = mixed(chunks, JSON, BULK_BAD)
        with ThreadPoolExecutor(2) as pool:  # both lanes at once
            lanes = [
                pool.submit(send_concurrently, endpoints, STREAM, *stream, clients=STREAM_CLIENTS),
                pool.submit(send_concurrently, endpoints, BULK, *bulk, clients=BULK_CLIENTS),
            ]
            answers = [answer for lane in lanes for answer in lane.result()]
        assert sorted({answer.reply.status_code for answer in answers}) == [200, 400]
        settled(prometheus, metrics_url)
        yield LoadRun(prometheus, before, snapshot(prometheus), requests.get(metrics_url, timeout=30).text)


def delta(run: LoadRun, key: str) -> dict[str, float]:
    return {label: value - run.before[key].get(label, 0.0) for label, value in run.after[key].items()}


def lanes_delta(run: LoadRun, key: str) -> dict[str, float]:
    """The change on the two lanes this test drives (the shared server may carry others, e.g. digits-seq)."""
    return {lane: run.after[key].get(lane, 0.0) - run.before[key].get(lane, 0.0) for lane in (STREAM, BULK)}


def test_latency_percentiles_per_lane(load_run):
    quantiles = {}
    for q in (0.5, 0.95, 0.99):
        expr = f"histogram_quantile({q}, sum by (lane, le) (rate(HandlerLatencySeconds_bucket[1m])))"
        quantiles[q] = load_run.prometheus.values(expr, "lane")
    print(f"\nhandler seconds per batch p50/p95/p99 over 1m: {quantiles}")
    for lane in (STREAM, BULK):
        p50, p95, p99 = (quantiles[q][lane] for q in (0.5, 0.95, 0.99))
        assert all(math.isfinite(p) for p in (p50, p95, p99)), lane
        assert 0 < p50 <= p95 <= p99 <= 10, lane  # 10 s: the largest finite default bucket


def test_rows_per_second_and_every_row_counted(load_run):
    rows_per_second = load_run.prometheus.values("sum by (lane) (rate(HandlerBatchRows_sum[1m]))", "lane")
    print(f"\nrows/s over 1m: {rows_per_second}")
    assert rows_per_second[STREAM] > 0 and rows_per_second[BULK] > 0
    assert lanes_delta(load_run, "rows") == {STREAM: STREAM_GOOD, BULK: BULK_GOOD * BULK_ROWS}  # bad requests: 0 rows
    assert lanes_delta(load_run, "requests") == {STREAM: STREAM_GOOD + STREAM_BAD, BULK: BULK_GOOD + BULK_BAD}


def test_concurrent_stream_requests_are_batched(load_run):
    histogram = delta(load_run, "stream_batches")
    ordered = sorted(histogram.items(), key=lambda item: float(item[0]))
    print(f"\nstream lane, requests per TorchServe batch (cumulative buckets, this run): {ordered}")
    batches = histogram["+Inf"]
    assert histogram["1.0"] < batches  # mass above 1 request per batch
    mean = delta(load_run, "requests")[STREAM] / batches
    print(f"stream lane: {batches:.0f} batches for {STREAM_GOOD + STREAM_BAD} requests, {mean:.2f} requests per batch")
    assert mean > 1


def test_error_counts_and_rate(load_run):
    assert lanes_delta(load_run, "errors_400") == {STREAM: STREAM_BAD, BULK: BULK_BAD}
    assert load_run.after["requests_4xx"] - load_run.before["requests_4xx"] >= STREAM_BAD + BULK_BAD
    ratio = load_run.prometheus.values(
        "sum by (lane) (rate(HandlerErrors[1m])) / sum by (lane) (rate(HandlerBatchRequests_sum[1m]))", "lane"
    )
    print(f"\nerror ratio over 1m: {ratio}")
    assert 0 < ratio[STREAM] < 0.5 and 0 < ratio[BULK] < 0.5


def test_alert_rules_load_and_evaluate_on_the_live_series(load_run):
    prometheus = load_run.prometheus
    groups = requests.get(f"{prometheus.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) >= 10 and all(rule["health"] == "ok" for rule in rules), [r for r in rules if r["health"] != "ok"]
    p99 = prometheus.wait_for(f'lane:handler_latency_seconds:p99_5m{{lane="{STREAM}"}}')
    errors = prometheus.wait_for(f'lane:handler_error_ratio:5m{{lane="{STREAM}",class="4xx"}}')
    print(f"\nrecorded p99 {p99[0]['value'][1]} s, 4xx ratio {errors[0]['value'][1]} on {STREAM}")
    prometheus.wait_for(f'lane:queue_seconds:mean_5m{{lane="{STREAM}"}}')


def test_every_dashboard_query_runs_and_reads_metrics_the_server_exports(load_run):
    with_samples, declared = exported_names(load_run.metrics_text)
    queries = dashboard_queries()
    names = set().union(*(metric_names(query) for query in queries))
    assert names - with_samples - set(EXEMPT) == set()
    assert set(EXEMPT) & names <= declared  # exempt from samples, not from being declared
    for query in queries:  # valid PromQL once Grafana's variables are filled in
        load_run.prometheus.query(query.replace("$lane", ".*").replace("$__rate_interval", "1m").replace("$__range", "5m"))
