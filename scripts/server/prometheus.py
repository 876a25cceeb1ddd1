"""A throwaway Prometheus scraping a TorchServe's metrics port (the monitoring tests), and the names a PromQL query
or a /metrics page mentions (the dashboard checks). Prometheus is Debian's `prometheus` package (it brings promtool)."""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests

from scripts.errors import ServerError
from scripts.layout import ROOT
from scripts.server.process import free_port, stop_process_group, wait_until

MONITORING = ROOT / "monitoring"
ALERTS = MONITORING / "alerts.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
INSTALL_HELP = "install Prometheus and promtool: `apt-get install -y prometheus` (Debian/Ubuntu; .ci/run does)"


def binary(name: str) -> Path:
    """`prometheus` or `promtool` from PATH (Debian puts both in /usr/bin); a ServerError says how to install them."""
    found = shutil.which(name) or next((p for p in (Path("/usr/bin") / name,) if p.exists()), None)
    if found is None:
        raise ServerError(f"{name} not found: {INSTALL_HELP}")
    return Path(found)


@dataclass
class Prometheus:
    """A running Prometheus: its HTTP API."""

    url: str
    workdir: Path

    def query(self, expr: str) -> list[dict]:
        """An instant query's result vector: [{"metric": {labels}, "value": [time, "value"]}, ...]."""
        reply = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = reply.json()
        if reply.status_code != 200 or body.get("status") != "success":
            raise ServerError(f"query {expr!r} failed: {body.get('error', reply.text)}")
        return body["data"]["result"]

    def values(self, expr: str, by: str) -> dict[str, float]:
        """{value of label `by`: sample value} of an instant query."""
        return {sample["metric"].get(by, ""): float(sample["value"][1]) for sample in self.query(expr)}

    def value(self, expr: str) -> float:
        """The single value of a query that aggregates to one sample (0 when it has none); NaN stays NaN."""
        result = self.query(expr)
        if len(result) > 1:
            raise ServerError(f"query {expr!r} gave {len(result)} samples, expected one")
        return float(result[0]["value"][1]) if result else 0.0

    def wait_for(self, expr: str, timeout: float = 30.0) -> list[dict]:
        """Poll until `expr` has a non-empty, non-NaN result (e.g. a scrape that saw the latest traffic)."""
        deadline = time.monotonic() + timeout
        while True:
            result = [s for s in self.query(expr) if not math.isnan(float(s["value"][1]))]
            if result:
                return result
            if time.monotonic() > deadline:
                raise ServerError(f"no result for {expr!r} after {timeout:.0f}s; see {self.workdir / 'prometheus.out'}")
            time.sleep(0.25)


@contextlib.contextmanager
def scraping(metrics_address: str, workdir: Path, interval: str = "1s", rules: Path | None = ALERTS) -> Iterator[Prometheus]:
    """Prometheus on a free port, scraping `metrics_address` (http://host:port) every `interval` and evaluating
    `rules` as often, its data in `workdir`; yields once the target is up; always stopped (SIGTERM, then SIGKILL)."""
    workdir.mkdir(parents=True, exist_ok=True)
    target = metrics_address.split("://", 1)[-1].rstrip("/")
    rule_files = f"rule_files: [{str(rules)!r}]\n" if rules is not None else ""
    config = workdir / "prometheus.yml"
    config.write_text(
        f"global: {{scrape_interval: {interval}, evaluation_interval: {interval}}}\n"
        + rule_files
        + f"scrape_configs:\n  - job_name: torchserve\n    static_configs: [{{targets: [{target!r}]}}]\n"
    )
    port = free_port()
    command = [
        str(binary("prometheus")),
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
    ]
    with open(workdir / "prometheus.out", "wb") as log:
        process = subprocess.Popen(command, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        prometheus = Prometheus(f"http://127.0.0.1:{port}", workdir)
        _wait_ready(prometheus, process)
        prometheus.wait_for('up{job="torchserve"} == 1')
        yield prometheus
    finally:
        stop_process_group(process, timeout=15)


def _wait_ready(prometheus: Prometheus, process: subprocess.Popen, timeout: float = 30.0) -> None:
    def ready() -> bool:
        with contextlib.suppress(requests.ConnectionError):
            return requests.get(f"{prometheus.url}/-/ready", timeout=5).status_code == 200
        return False

    log = prometheus.workdir / "prometheus.out"
    late = f"prometheus not ready after {timeout:.0f}s; see {log}"
    wait_until(ready, timeout, process, f"prometheus exited with {{code}}; see {log}", lambda: late)


# -- names ------------------------------------------------------------------------------------------------------

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTORS = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]")
_GROUPINGS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NUMBERS = re.compile(r"(?<![\w:])\d+(?:\.\d+)?(?:e[+-]?\d+)?\b", re.IGNORECASE)
_NAMES = re.compile(r"(?<![\w:$])([A-Za-z_:][\w:]*)\b(?!\s*\()")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
_KEYWORDS |= {"inf", "nan", "atan2"}
_SERIES = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{|\s)", re.MULTILINE)
_TYPES = re.compile(r"^# TYPE ([A-Za-z_:][\w:]*) (\w+)$", re.MULTILINE)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (not its functions, labels, keywords, or Grafana $variables)."""
    text = _STRINGS.sub('""', expr)
    text = _SELECTORS.sub(" ", text)
    text = _GROUPINGS.sub(" ", text)
    text = _NUMBERS.sub(" ", text)
    return {name for name in _NAMES.findall(text) if name.lower() not in _KEYWORDS}


def exported_names(metrics_text: str) -> tuple[set[str], set[str]]:
    """(names with samples, names declared by a # TYPE line) on a /metrics page; a histogram's family declares
    its _bucket, _sum and _count series."""
    declared = set()
    for family, kind in _TYPES.findall(metrics_text):
        declared |= {family + suffix for suffix in ("_bucket", "_sum", "_count")} if kind == "histogram" else {family}
    return set(_SERIES.findall(metrics_text)), declared


def dashboard_queries(path: Path = DASHBOARD) -> list[str]:
    """Every PromQL query of a Grafana dashboard: its panels' targets and its variables' label_values(<query>, label)."""
    dashboard = json.loads(path.read_text())
    panels = [panel for top in dashboard["panels"] for panel in [top, *top.get("panels", [])]]
    queries = [target["expr"] for panel in panels for target in panel.get("targets", [])]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        match = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", text)
        queries.append(match.group(1) if match else text)
    return [query for query in queries if query]
