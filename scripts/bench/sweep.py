"""Each peer's small sweep: every candidate setting of its file briefly at a few loads, the best kept.

    python -m scripts.bench.sweep [--peer flask litserve ray bentoml pytriton] [--models NAME ...]
                                  [--connections 1 64] [--seconds 2] [--no-report]

Per peer and model, one candidate after the other: start the peer with it, check its answer against the core's
(the lane's answer, computed here in process), run wrk at each number of connections, stop it. The best is the
candidate with the most req/s at the highest load (the lower p99 on a tie within 3%); `make bench` runs each
peer with the candidate the model's folder keeps (models/<name>/model.yaml, bench.peers: an index), which a person
sets to the best after a sweep (the table says whether they match; `--report-only` writes the table again from the
files, e.g. after bench.peers changed). --models: every model of models/ unless named. Writes
build/bench/sweep-<peer>.json and, from every such file present, the "peer sweeps" section of docs/benchmarks.md.
A candidate that fails is a row with its error.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date

import orjson

from models import registry
from scripts import cli
from scripts.bench import rivals
from scripts.bench.peers.field import Peer, describe
from scripts.bench.peers.roster import peer, peers
from scripts.bench.report import replace_section
from scripts.bench.results import ModelBench
from scripts.bench.stream import request_body
from scripts.layout import BUILD, MODEL_STORE
from scripts.server.config import ServerConfig


@dataclass
class Trial:
    """One candidate's runs (connections -> run dict), or why it has none."""

    settings: dict
    runs: dict[int, dict] = field(default_factory=dict)
    failed: str = ""

    def score(self, top: int) -> tuple[float, float]:
        run = self.runs.get(top)
        if not rivals.served(run):
            return (0.0, 0.0)
        return (run["rps"], -run["p99_ms"])


def best(trials: list[Trial], top: int) -> Trial | None:
    """The most req/s at `top` connections; within 3% of it, the lowest p99. None when no candidate served."""
    served = [trial for trial in trials if trial.score(top)[0] > 0]
    if not served:
        return None
    most = max(trial.score(top)[0] for trial in served)
    close = [trial for trial in served if trial.score(top)[0] >= 0.97 * most]
    return max(close, key=lambda trial: trial.score(top)[1])


def lane_answer(model: str, body: bytes) -> dict:
    """What the lane answers to `body`: the archive's core in process (the same decode, forward and encode)."""
    from handlers.decoding import read_body
    from scripts.archive.core import load_core

    (answer,) = load_core(MODEL_STORE / f"{model}.mar").answer([read_body(orjson.loads(body))])
    return orjson.loads(orjson.dumps(answer.body))  # as a client parses it


def sweep_peer(subject: Peer, model: str, connections: tuple[int, ...], seconds: float, warmup: float) -> list[Trial]:
    body, archive = request_body(model), MODEL_STORE / f"{model}.mar"
    expected = lane_answer(model, body)
    trials = []
    for settings in subject.candidates_for(model):
        one = dataclasses.replace(subject, pinned=settings)
        bench = ModelBench(model, ServerConfig.read().lane_settings(model)[model], 0)
        rivals.run_peer(one, model, archive, body, expected, bench, connections, seconds, warmup)
        trial = Trial(settings, {run["connections"]: run for run in bench.closed.get(subject.name, [])})
        trial.failed = bench.failed.get(subject.name, "")
        trials.append(trial)
    return trials


def kept_now(key: str, model: str, settings: dict) -> bool:
    """Whether `settings` are what `make bench` runs now for this peer and model (its model.yaml's bench.peers)."""
    return peer(key).settings_for(model) == settings


INTRO = (
    "## Peers' sweeps: the best setting of each peer, and the one kept\n\n"
    "`python -m scripts.bench.sweep` (`make bench-sweep`): each peer's candidates (its _candidates or CANDIDATES under "
    "scripts/bench/peers/) started one after the other, checked to answer as the lane does, then wrk "
    "at each load; the best is the most req/s at the highest load (the lower p99 within 3%). `make bench` runs "
    'each peer with the candidate models/<name>/model.yaml keeps (bench.peers); "kept" marks them (they should be '
    "the best). Shown: the best, the kept and the failed candidates; every candidate's figures are in "
    "build/bench/sweep-<peer>.json. One part a model: a sweep of some models (`--models`) rewrites only theirs."
)


def section(results: dict[str, dict], model: str, kept: Callable[[str, str, dict], bool] = kept_now) -> str:
    """One model's part of the "peer sweeps" section from every sweep file's results (peer key -> its JSON)."""
    swept = {key: data for key, data in results.items() if model in data["models"]}
    connections = _connections(swept)
    lines = [
        f"### {model}",
        "",
        *(
            f"{data['peer']}: run {run['date']}, {run['seconds']:g} s per point after a {run['warmup']:g} s warm-up."
            for data in swept.values()
            for run in [data.get("runs", {}).get(model, data)]
        ),
        "",
        "| peer | model | settings | " + " | ".join(f"{c} conn: req/s, p50 / p99 ms" for c in connections) + " | |",
        "| --- | --- | --- | " + " ---: |" * len(connections) + " --- |",
    ]
    for key, data in swept.items():
        trials = data["models"][model]
        top = max(data["connections"])
        chosen = best([Trial(t["settings"], {int(c): r for c, r in t["runs"].items()}, t["failed"]) for t in trials], top)
        for trial in trials:
            runs = {int(c): r for c, r in trial["runs"].items()}
            cells = [rivals.cell(runs.get(c)) if not trial["failed"] else "-" for c in connections]
            flags = (
                ("best", chosen is not None and chosen.settings == trial["settings"]),
                ("kept", kept(key, model, trial["settings"])),
            )
            marks = [mark for mark, on in flags if on]
            if not marks and not trial["failed"]:
                continue
            if trial["failed"]:
                cells[0] = f"failed: {trial['failed'][:200]}"
            row = f"| {data['peer']} | {model} | {describe(trial['settings'])} | " + " | ".join(cells)
            lines.append(row + f" | {', '.join(marks)}{f' (of {len(trials)} tried)' if marks else ''} |")
    return "\n".join(lines)


def _connections(results: dict[str, dict]) -> list[int]:
    return sorted({c for data in results.values() for c in data["connections"]})


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--peer", nargs="+", default=[p.key for p in peers()])
    parser.add_argument("--models", nargs="+", default=list(registry.models()))
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--no-report", action="store_true", help="print only; leave docs/benchmarks.md alone")
    parser.add_argument("--report-only", action="store_true", help="run nothing: the section again from build/bench's files")
    args = parser.parse_args(argv)
    connections = tuple(sorted(args.connections))
    folder = BUILD / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    for key in [] if args.report_only else args.peer:
        subject = peer(key)
        path = folder / f"sweep-{key}.json"
        # the models swept before keep their trials: a sweep of some models replaces only theirs
        data = json.loads(path.read_text()) if path.exists() else {"peer": subject.name, "models": {}}
        data.update({"connections": list(connections)})
        runs = data.setdefault("runs", {})
        for model in args.models:
            print(f"{subject.name}, {model}", flush=True)
            trials = sweep_peer(subject, model, connections, args.seconds, args.warmup)
            chosen = best(trials, connections[-1])
            data["models"][model] = [{"settings": t.settings, "runs": t.runs, "failed": t.failed} for t in trials]
            runs[model] = {"date": date.today().isoformat(), "seconds": args.seconds, "warmup": args.warmup}
            print(f"  best for {model}: {describe(chosen.settings) if chosen else 'none served'}", flush=True)
            path.write_text(json.dumps(data, indent=1))
    results = {p.key: json.loads((folder / f"sweep-{p.key}.json").read_text()) for p in peers()
               if (folder / f"sweep-{p.key}.json").exists()}  # fmt: skip
    swept = [model for model in registry.models() if any(model in data["models"] for data in results.values())]
    parts = {model: section(results, model) for model in swept if args.report_only or model in args.models}
    print("\n\n".join([INTRO, *parts.values()]))
    if not args.no_report:
        replace_section("peer sweeps", INTRO)
        for model, text in parts.items():
            earlier = [f"peer sweeps: {other}" for other in registry.models() if other < model]
            replace_section(f"peer sweeps: {model}", text, after=("peer sweeps", *earlier))
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
