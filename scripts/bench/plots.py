"""PNG plots for docs/benchmarks.md: throughput and latency against connections, latency against offered load."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no screen
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

from scripts.bench.results import ModelBench  # noqa: E402 - after choosing the backend


def write(bench: ModelBench, folder: Path) -> list[Path]:
    """The plots of one model's run, written to `folder`; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    written = [
        _throughput(bench, folder / f"{bench.model}-throughput.png"),
        _by_connections(bench, folder / f"{bench.model}-connections.png"),
    ]
    if bench.open:
        written.append(_latency(bench, folder / f"{bench.model}-latency.png"))
    return written


def _throughput(bench: ModelBench, path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(9, 4.5))
    for system, runs in bench.closed.items():
        axis.plot([run["connections"] for run in runs], [run["rps"] for run in runs], marker="o", label=system)
    axis.axhline(bench.cpu_limit, color="black", linestyle="--", linewidth=1, label=f"CPU limit {bench.cpu_limit:,.0f}/s")
    axis.axhline(bench.ceiling, color="grey", linestyle=":", linewidth=1, label=f"in-process ceiling {bench.ceiling:,.0f}/s")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("connections (closed loop, wrk)")
    axis.set_ylabel("requests/s (log)")
    axis.set_title(f"{bench.model}: throughput against connections")
    axis.legend(fontsize=8, ncol=2)
    return _save(figure, path)


def _by_connections(bench: ModelBench, path: Path) -> Path:
    axes = ("connections", "connections (closed loop, wrk)", "p50 and p99 against connections", True)
    return _percentiles(bench.model, bench.closed, axes, path)


def _latency(bench: ModelBench, path: Path) -> Path:
    axes = ("offered_rps", "offered requests/s (open loop, k6)", "latency against offered load", False)
    return _percentiles(bench.model, bench.open, axes, path)


def _percentiles(model: str, by_system: dict[str, list[dict]], axes: tuple[str, str, str, bool], path: Path) -> Path:
    """p99 (solid) and p50 (dashed, same colour) of every system against `axes`' x: (run key, label, title, log2 x)."""
    key, xlabel, title, log_x = axes
    figure, axis = plt.subplots(figsize=(9, 4.5))
    for system, runs in by_system.items():
        xs = [run[key] for run in runs]
        (line,) = axis.plot(xs, [run["p99_ms"] for run in runs], marker="o", label=f"{system} p99")
        axis.plot(xs, [run["p50_ms"] for run in runs], marker=".", linestyle="--", color=line.get_color(), label=f"{system} p50")
    if log_x:
        axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel(xlabel)
    axis.set_ylabel("latency ms (log)")
    axis.set_title(f"{model}: {title}")
    axis.legend(fontsize=7, ncol=3)
    return _save(figure, path)


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
