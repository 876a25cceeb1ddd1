"""Zero-downtime hot-swap of a model version on both lanes, and rollback (`make swap`, `make rollback`).

    python -m scripts.swap.hot_swap swap --model digits --mar model_store/digits-2.0.mar
    python -m scripts.swap.hot_swap rollback --model digits

Swap, per lane (`digits`, `digits-bulk`, batching from config.properties):
  1. register the archive's version with the lane's batching and workers, synchronously (workers loaded);
  2. warm-up gate: the model's samples to /predictions/<lane>/<new version>; an archive that fails to load or
     answers badly is unregistered again and the old default stays. Then the new version is warmed: the lane's
     own requests to the same URL until its rate is steady or `warm_seconds` pass (scripts/server/warmup.py),
     so its workers' first calls are paid before clients come (what it buys: docs/benchmarks.md, "Warm-up");
  3. set-default: from here on every unversioned request goes to the new version;
  4. drain: wait until the old version's queue is empty and its workers finished the batch in hand;
  5. unregister the old version.
The swap is recorded in <model store>/swap-history.json; rollback swaps back to the archive the last
swap replaced (re-registered from the model store, through the same gate) and drops that record.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests

from models import registry
from scripts import cli
from scripts.archive.reader import MarFile
from scripts.clients.load import send_concurrently
from scripts.errors import ArchiveError, ScriptError
from scripts.layout import JSON
from scripts.server.config import LaneSettings, ServerConfig
from scripts.server.endpoints import Endpoints
from scripts.server.samples_gate import GateResult, gate, probe
from scripts.server.warmup import WarmUp, warm_version
from scripts.swap.management import ManagementApi, ManagementError, VersionState

HISTORY = "swap-history.json"
POLL_SECONDS = 0.05


class SwapRefused(ScriptError):
    """The swap did not happen (bad archive, gate failed, ...); the old default still serves."""


@dataclass(frozen=True)
class Archive:
    path: Path
    model: str
    version: str


@dataclass
class SwapReport:
    model: str
    new_version: str
    old_versions: dict[str, str]  # lane -> version it replaced
    gates: list[GateResult] = field(default_factory=list)
    warmups: list[WarmUp] = field(default_factory=list)
    started: float = 0.0  # time.monotonic() before the first register
    default_requested: dict[str, float] = field(default_factory=dict)
    default_set: dict[str, float] = field(default_factory=dict)  # when set-default returned, per lane
    finished: float = 0.0  # when the last old version was unregistered

    @property
    def seconds(self) -> float:
        return self.finished - self.started


@dataclass
class Swapper:
    """Everything a swap needs to know about one server."""

    endpoints: Endpoints
    config: Path
    model_store: Path
    log: Callable[[str], None] = print
    warm_seconds: float = 8.0  # the most a new version's warm-up may take per lane; 0: no warm-up

    @property
    def api(self) -> ManagementApi:
        return ManagementApi(self.endpoints)

    # -- swap -----------------------------------------------------------------------------------

    def swap(self, model: str, mar: Path, record: bool = True) -> SwapReport:
        archive = self.read_archive(mar, model)
        lanes = ServerConfig.read(self.config).lane_settings(model)
        current = {lane: self.current_default(lane, archive.version) for lane in lanes}
        old = {lane: state.version for lane, state in current.items()}
        report = SwapReport(model, archive.version, old, started=time.monotonic())
        self.register_and_gate(archive, lanes, gate, report)
        for lane in lanes:
            report.default_requested[lane] = time.monotonic()
            self.api.set_default(lane, archive.version)
            report.default_set[lane] = time.monotonic()
            self.log(f"{lane}: default is now {archive.version} (was {old[lane]})")
        for lane in lanes:
            self.drain(lane, old[lane], probe(lane))
            self.api.unregister(lane, old[lane])
            self.log(f"{lane}: unregistered {old[lane]}")
        report.finished = time.monotonic()
        if record:
            self.record(model, current[model] if model in current else next(iter(current.values())), archive)
        self.log(f"swapped {model} to {archive.version} in {report.seconds:.1f}s (register to old version unregistered)")
        return report

    def read_archive(self, mar: Path, model: str) -> Archive:
        if not mar.exists():
            raise SwapRefused(
                f"{mar} does not exist: build it with `make archive VERSION=<version>` (writes model_store/{model}-<version>.mar)"
            )
        if mar.resolve().parent != self.model_store.resolve():
            raise SwapRefused(
                f"{mar} is not in the server's model store {self.model_store}"
                f": copy it there (TorchServe loads archives from its store only)"
            )
        try:
            name, version = MarFile(mar).model_name, MarFile(mar).version
        except ArchiveError as error:
            raise SwapRefused(str(error)) from None
        if name != model:
            raise SwapRefused(f"{mar} holds model {name!r}, not {model!r}: pick an archive of {model}")
        try:
            MarFile(mar).verify_digest()
        except ArchiveError as error:
            raise SwapRefused(str(error)) from None
        return Archive(mar, model, version)

    def current_default(self, lane: str, new_version: str | None = None) -> VersionState:
        """The version `lane` serves now; refuses a `new_version` that is registered already."""
        versions = self.api.versions(lane)  # ManagementError names an unknown model
        if any(state.version == new_version for state in versions):
            listed = ", ".join(state.version for state in versions)
            raise SwapRefused(
                f"version {new_version} of {lane!r} is already registered (registered: {listed})"
                f"; build the archive with another version"
            )
        return next(state for state in versions if state.default)

    def register_and_gate(self, archive: Archive, lanes: dict[str, LaneSettings], gate, report: SwapReport) -> None:
        """Register on every lane, then gate every lane; on any failure unregister what was registered."""
        registered: list[str] = []
        try:
            for lane, settings in lanes.items():
                self.api.register(lane, archive.path, settings)
                registered.append(lane)
                self.log(
                    f"{lane}: registered {archive.version} from {archive.path.name} "
                    f"({settings.workers} worker(s), batch {settings.batch_size}/{settings.max_batch_delay} ms)"
                )
            for lane in lanes:
                result = gate(self.endpoints, lane, archive.version)
                report.gates.append(result)
                self.log(f"{lane}: {result.summary()}")
                if not result.passed:
                    raise SwapRefused(f"{archive.path.name} refused: {result.summary()}")
            for lane in lanes if self.warm_seconds > 0 else ():
                try:
                    warmed = warm_version(self.endpoints, lane, archive.version, self.warm_seconds)
                except (ScriptError, requests.RequestException) as error:  # wrk failing, say: refused, not half done
                    raise SwapRefused(f"{archive.path.name} refused: the warm-up of {lane} broke: {error}") from None
                report.warmups.append(warmed)
                self.log(f"{lane}: {warmed.summary()}")
                if warmed.failed:
                    raise SwapRefused(f"{archive.path.name} refused: {warmed.summary()}")
        except (ManagementError, SwapRefused) as error:
            for lane in registered:
                self.api.unregister(lane, archive.version)
                self.log(f"{lane}: unregistered the refused {archive.version}")
            kept = ", ".join(f"{lane} stays on {version}" for lane, version in report.old_versions.items())
            raise SwapRefused(f"{error}; {kept}") from None

    def drain(self, lane: str, version: str, probe: bytes) -> None:
        """Return once `version` of `lane` has nothing queued and nothing in a worker.

        TorchServe routes a request when it arrives, so after set-default no new work reaches the old
        version; what it already accepted is in its queue (describe-model's pendingRequests) or in a
        worker's current batch, which unregister would kill. The queue is observable; the batch in hand
        is not, so probes sent to the old version after its queue emptied are the barrier: a worker
        answers a probe only after the batch it held went out, and every answer names its worker
        (X-Worker-Pid). Once each of the version's workers has answered one, none holds a request.
        """
        state = self.api.version(lane, version)
        deadline = time.monotonic() + 2 * state.response_timeout
        quiet = 0
        while quiet < 2:  # two empty looks in a row: no request was between routing and queueing
            if time.monotonic() > deadline:
                raise ManagementError(
                    f"{lane} {version} still has {state.pending_requests} queued requests after {2 * state.response_timeout}s; "
                    f"it stays registered (not default): unregister it when idle with DELETE /models/{lane}/{version}"
                )
            time.sleep(POLL_SECONDS)
            state = self.api.version(lane, version)
            quiet = quiet + 1 if state.pending_requests == 0 else 0
        probes = self.probe_every_worker(lane, version, probe, state, deadline)
        self.log(f"{lane}: drained {version} (queue empty, {len(state.worker_pids)} worker(s) answered {probes} barrier probes)")

    def probe_every_worker(self, lane: str, version: str, probe: bytes, state: VersionState, deadline: float) -> int:
        """Probe `version` until each of its workers has answered one; returns how many probes it took."""
        waiting, sent, count = set(state.worker_pids), 0, max(1, len(state.worker_pids))
        while sent == 0 or waiting:  # at least one round, also if describe-model named no worker
            if time.monotonic() > deadline:
                raise ManagementError(f"{lane} {version}: workers {sorted(waiting)} answered no probe; it stays registered")
            # As many probes at once as workers: an idle worker takes what is queued, a busy one takes the
            # next probe only after its batch, so rounds go on until the busy ones have come back.
            bodies, kinds = [probe] * count, [JSON] * count
            answers = send_concurrently(self.endpoints, lane, bodies, kinds, count, state.response_timeout + 10, version)
            sent += count
            waiting -= {answer.worker_pid for answer in answers}
        return sent

    # -- history and rollback -------------------------------------------------------------------

    @property
    def history_file(self) -> Path:
        return self.model_store / HISTORY

    def history(self) -> dict[str, list[dict]]:
        return json.loads(self.history_file.read_text()) if self.history_file.exists() else {}

    def record(self, model: str, old: VersionState, archive: Archive) -> None:
        """Remember which archive the swap replaced: the old version is unregistered, so only this knows it."""
        history = self.history()
        entry = {"from": {"version": old.version, "url": old.url}, "to": {"version": archive.version, "url": archive.path.name}}
        history.setdefault(model, []).append(entry)
        self.history_file.write_text(json.dumps(history, indent=2) + "\n")

    def rollback(self, model: str) -> SwapReport:
        history = self.history()
        entries = history.get(model, [])
        if not entries:
            raise SwapRefused(
                f"no recorded swap of {model!r} in {self.history_file}: nothing to roll back (rollback undoes `make swap`)"
            )
        last = entries[-1]
        current = self.current_default(model).version
        if current != last["to"]["version"]:
            raise SwapRefused(
                f"{model} serves {current}, but the last recorded swap went to {last['to']['version']}"
                f": roll back by hand with `make swap MAR=...`"
            )
        report = self.swap(model, self.model_store / last["from"]["url"], record=False)
        entries.pop()
        self.history_file.write_text(json.dumps(history, indent=2) + "\n")
        return report


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("action", choices=["swap", "rollback"])
    registry.add_model_option(parser, "the model (its stream lane's name); its -bulk lane swaps with it")
    parser.add_argument("--mar", type=Path, help="swap: the new archive, in the model store (model_store/<model>-<version>.mar)")
    parser.add_argument(
        "--warm-up-seconds", type=float, default=8.0, help="the most the new version's warm-up may take per lane (0: none)"
    )
    cli.add_server_options(parser)
    args = parser.parse_args(argv)
    if args.action == "swap" and args.mar is None:
        parser.error("swap needs --mar model_store/<model>-<version>.mar (make swap MAR=...)")
    config = ServerConfig.read(args.config)
    endpoints = Endpoints.from_config(args.config, args.key_file)
    swapper = Swapper(endpoints, args.config, config.model_store, warm_seconds=args.warm_up_seconds)
    if args.action == "swap":
        swapper.swap(args.model, args.mar)
    else:
        swapper.rollback(args.model)
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(), prefix="refused")
