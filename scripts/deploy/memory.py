"""The pod's memory, derived in one place from the per-lane numbers (docs/kubernetes.md, "Memory").

    python -m scripts.deploy.memory        # the sum, lane by lane
    python -m scripts.deploy.memory --write   # and into -Xmx, the pod's memory, the guide (make archive does)

What the torchserve container may hold at once: each lane's workers at their worst measured peak, the
frontend's heap (its own needs plus every request body a lane can hold: queued, in its workers' batches) and
the JVM outside its heap. deploy/k8s/deployment.yaml's memory, config.properties' -Xmx and
-XX:MaxDirectMemorySize and the gateway's per-route connection limits are checked against it
(tests/unit/deploy/test_manifests.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from models import registry
from scripts import cli
from scripts.errors import ConfigError
from scripts.layout import CONFIG, ROOT
from scripts.server.config import ServerConfig
from scripts.server.front_door import archive_yaml, bulk_admitted, lane_body_bytes

MIB = 1024 * 1024
# The worst worker peak RSS on each lane, MiB, as each model's folder declares it (models/<name>/model.yaml's
# worker_peak_mib: scripts/hardening/worker_memory.py on CPU workers). A CUDA worker also maps the CUDA runtime and
# its context into host memory, which no machine here can measure: docs/kubernetes.md says what to add.
WORKER_PEAK_MIB = {lane.name: lane.worker_peak_mib for lane in registry.lanes()}
# The frontend's heap beside request bodies (Netty, the model registry, metrics) and the JVM outside its heap
# (metaspace, code, threads' stacks, GC tables): a resting TorchServe's JVM here took 250 to 400 MiB in all.
FRONTEND_HEAP_BASE_MIB = 512
JVM_NATIVE_MIB = 256
ROUND_MIB = 256
GATEWAY_CONF = ROOT / "deploy" / "k8s" / "gateway" / "nginx.conf"


@dataclass(frozen=True)
class LaneMemory:
    lane: str
    workers: int
    worker_peak_mib: int
    body_bytes: int  # the most one request's body may have on this lane
    held_bodies: int  # the most request bodies the frontend holds for this lane at once
    gateway_limit: int | None  # the gateway's connections at once on this lane's route (None: TorchServe's queue)

    @property
    def workers_mib(self) -> int:
        return self.workers * self.worker_peak_mib

    @property
    def bodies_mib(self) -> int:
        return math.ceil(self.held_bodies * self.body_bytes / MIB)


@dataclass(frozen=True)
class PodMemory:
    lanes: list[LaneMemory]
    heap_mib: int  # -Xmx
    direct_mib: int  # -XX:MaxDirectMemorySize: Netty reads a body there before TorchServe copies it to the heap

    @property
    def workers_mib(self) -> int:
        return sum(lane.workers_mib for lane in self.lanes)

    @property
    def torchserve_mib(self) -> int:
        """The torchserve container's memory request and limit."""
        return _round_up(self.workers_mib + self.heap_mib + self.direct_mib + JVM_NATIVE_MIB)


def derive(config: ServerConfig | None = None) -> PodMemory:
    config = config or ServerConfig.read()
    lanes = [_lane_memory(config, lane, archive) for lane, archive in config.loaded_lanes().items()]
    bodies = sum(lane.bodies_mib for lane in lanes)
    return PodMemory(lanes, _round_up(FRONTEND_HEAP_BASE_MIB + bodies), _round_up(bodies))


def _lane_memory(config: ServerConfig, lane: str, archive: str) -> LaneMemory:
    settings = _lane_settings(config, lane)
    body = lane_body_bytes(config, lane, archive)
    if lane.endswith("-bulk"):
        gateway, held = bulk_admitted(config, lane), bulk_admitted(config, lane)
    else:  # the gateway cuts the route at its byte limit; TorchServe queues up to job_queue_size beside the batches
        queue = archive_yaml(archive).get("jobQueueSize") or config.job_queue_size
        gateway, held = None, queue + settings.workers * settings.batch_size
    return LaneMemory(lane, settings.workers, WORKER_PEAK_MIB[lane], body, held, gateway)


def _lane_settings(config: ServerConfig, lane: str):
    return config.lane_settings(lane.removesuffix("-bulk"))[lane]


def _round_up(mib: int) -> int:
    return math.ceil(mib / ROUND_MIB) * ROUND_MIB


def jvm_flags(vmargs: str) -> dict[str, int]:
    """-Xmx and -XX:MaxDirectMemorySize from config.properties' vmargs, in MiB ({} where absent)."""
    flags = {}
    for name, pattern in (("heap", r"-Xmx(\d+)m\b"), ("direct", r"-XX:MaxDirectMemorySize=(\d+)m\b")):
        found = re.search(pattern, vmargs)
        if found:
            flags[name] = int(found.group(1))
    return flags


def gateway_limits(text: str) -> dict[str, int]:
    """{lane: limit_conn} for each bulk route of the gateway's nginx.conf."""
    found = re.findall(r"location ~ \^/predictions/([\w-]+)\(/\[\^/\]\*\)\?\$ \{[^}]*?limit_conn bulk (\d+);", text)
    return {lane: int(limit) for lane, limit in found}


def summary(pod: PodMemory) -> str:
    lines = [
        f"{lane.lane}: {lane.workers} x {lane.worker_peak_mib} MiB workers; bodies {lane.held_bodies} x "
        f"{lane.body_bytes / MIB:g} MiB = {lane.bodies_mib} MiB"
        + (f" (gateway: {lane.gateway_limit} at once)" if lane.gateway_limit else " (job_queue_size + batches)")
        for lane in pod.lanes
    ]
    lines.append(
        f"torchserve: workers {pod.workers_mib} + heap {pod.heap_mib} (-Xmx) + direct {pod.direct_mib} + JVM "
        f"{JVM_NATIVE_MIB} = {pod.workers_mib + pod.heap_mib + pod.direct_mib + JVM_NATIVE_MIB} MiB -> "
        f"{pod.torchserve_mib} MiB ({pod.torchserve_mib / 1024:g} GiB)"
    )
    return "\n".join(lines)


DEPLOYMENT = ROOT / "deploy" / "k8s" / "deployment.yaml"
INFERENCE_SERVICE = ROOT / "deploy" / "kserve" / "inferenceservice.yaml"
GUIDE = ROOT / "docs" / "kubernetes.md"
GUIDE_BEGIN, GUIDE_END = "<!-- memory: written by python -m scripts.deploy.memory --write -->", "<!-- memory end -->"


def rewrite(
    pod: PodMemory,
    config: Path = CONFIG,
    deployment: Path = DEPLOYMENT,
    guide: Path = GUIDE,
    inference_service: Path = INFERENCE_SERVICE,
) -> list[Path]:
    """Write the derivation where it is used: config.properties' -Xmx and -XX:MaxDirectMemorySize, the TorchServe
    container's memory in deployment.yaml and in the InferenceService, the sum in the Kubernetes guide. Returns the
    files it changed."""
    pods = (deployment, inference_service)
    edits = {
        config: [
            (r"-Xmx\d+m\b", f"-Xmx{pod.heap_mib}m"),
            (r"-XX:MaxDirectMemorySize=\d+m\b", f"-XX:MaxDirectMemorySize={pod.direct_mib}m"),
        ],
        # In both pods the first two memory: lines are the TorchServe container's request and limit.
        **{path: [(r"(?m)^(\s+memory: )\d+Mi$", rf"\g<1>{pod.torchserve_mib}Mi")] for path in pods},
        guide: [
            (rf"(?s){re.escape(GUIDE_BEGIN)}.*?{re.escape(GUIDE_END)}", f"{GUIDE_BEGIN}\n```\n{summary(pod)}\n```\n{GUIDE_END}")
        ],
    }
    changed = []
    for path, replacements in edits.items():
        text = before = path.read_text()
        for pattern, replacement in replacements:
            text, count = re.subn(pattern, replacement, text, count=2 if path in pods else 1)
            if not count:
                raise ConfigError(f"{path}: nothing matches {pattern!r} to write the derived memory into")
        if text != before:
            path.write_text(text)
            changed.append(path)
    return changed


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--write", action="store_true", help="write the sum into config.properties, both pods, the guide")
    args = parser.parse_args()
    pod = derive()
    print(summary(pod))
    if args.write:
        for path in rewrite(pod):
            print(f"rewrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    cli.run(main)
