"""What the handler's metrics cost per request on the stream lane, in-process.

    python -m scripts.bench.metrics [--model NAME] [--requests 16] [--rounds 20] [--iterations 20]

Runs the real adapter's handle() from the model's archive (model_store/<model>.mar) on a batch of --requests
one-row requests of its samples, as TorchServe's worker would (a real ts Context and metrics cache from
monitoring/metrics.yaml, metric lines written through a stdout-like logging handler), alternately with the metrics
on and with no metric handles (the stage clocks still run), and prints the median time per request of each and
their difference. It also times the metric emission of one batch alone (HandlerMetrics.batch), the figure the
difference estimates with less noise. Prints only; docs/observability.md quotes a run.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

import orjson
from ts.context import Context, RequestProcessor
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

from handlers.core import StageTimes
from handlers.decoding import read_request
from handlers.torchserve.torchserve_handler import UnifiedHandler
from models import registry
from scripts import cli
from scripts.archive.reader import MarFile
from scripts.layout import MODEL_STORE
from scripts.server.config import ServerConfig


def context(model: str, model_dir: Path, config: dict[str, Any], requests: int) -> Context:
    metrics = MetricsCacheYamlImpl(config_file_path=str(ServerConfig.read().metrics_config))
    metrics.initialize_cache()
    manifest = {"model": {"modelName": model}}
    ctx = Context(model, str(model_dir), manifest, 16, None, "0.12.0", metrics=metrics, model_yaml_config=config)
    ctx.request_processor = [RequestProcessor({}) for _ in range(requests)]
    ctx.request_ids = {index: f"request-{index}" for index in range(requests)}
    metrics.request_ids = ctx.request_ids
    return ctx


def per_request_us(handler: UnifiedHandler, data: list[dict], ctx: Context, iterations: int) -> float:
    started = time.perf_counter()
    for _ in range(iterations):
        handler.handle(data, ctx)
    return (time.perf_counter() - started) / iterations / len(data) * 1e6


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--requests", type=int, default=16, help="requests in one TorchServe batch (the stream lane's batchSize)")
    parser.add_argument("--rounds", type=int, default=20, help="alternating rounds of each variant")
    parser.add_argument("--iterations", type=int, default=20, help="handle() calls per round")
    registry.add_model_option(parser)
    args = parser.parse_args()
    mar = MarFile(MODEL_STORE / f"{args.model}.mar")
    with mar.unpacked() as model_dir:
        return run(args, model_dir, mar.model_config())


def run(args, model_dir: Path, config: dict[str, Any]) -> int:

    # The worker logs "%(message)s" at INFO to its stdout, which the frontend reads: write the metric lines alike.
    sink = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    logging.basicConfig(stream=sink, format="%(message)s", level=logging.INFO, force=True)
    samples = registry.model(args.model).samples().request(args.requests)
    data = [{"body": bytearray(orjson.dumps({"instances": [sample]}))} for sample in samples]
    ctx = context(args.model, model_dir, config, len(data))
    with_metrics, without_metrics = UnifiedHandler(), UnifiedHandler()
    with_metrics.initialize(ctx)
    without_metrics.initialize(ctx)
    without_metrics.metrics.handles = {}  # no metric lines; the stage clocks and the rest unchanged

    for handler in (with_metrics, without_metrics):
        per_request_us(handler, data, ctx, 20)  # warm-up
    on, off = [], []
    for _ in range(args.rounds):
        on.append(per_request_us(with_metrics, data, ctx, args.iterations))
        off.append(per_request_us(without_metrics, data, ctx, args.iterations))

    responses = with_metrics.core.answer([read_request(request) for request in data])
    stages = StageTimes(0.001, 0.001, 0.002, 0.001, [len(data)])
    emissions = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        for _ in range(args.iterations):
            with_metrics.metrics.batch(responses, stages, 0.005)
        emissions.append((time.perf_counter() - started) / args.iterations * 1e6)

    on_us, off_us, emit_us = statistics.median(on), statistics.median(off), statistics.median(emissions)
    paired = sorted(a - b for a, b in zip(on, off, strict=True))
    low, high = paired[len(paired) // 4], paired[3 * len(paired) // 4]
    print(f"handle() on {len(data)} one-row {args.model} requests, median of {args.rounds} rounds x {args.iterations} batches:")
    print(f"  metrics on   {on_us:8.1f} us per request")
    print(f"  metrics off  {off_us:8.1f} us per request")
    print(f"  difference   {on_us - off_us:8.1f} us per request ({(on_us - off_us) / off_us:+.1%})")
    print(f"  difference per paired round, quartiles: {low:.1f} .. {high:.1f} us per request")
    print(f"  emission of one batch's metrics alone: {emit_us:.1f} us per batch = {emit_us / len(data):.2f} us per request")
    return 0


if __name__ == "__main__":
    cli.run(main)
