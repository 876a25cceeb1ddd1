"""`make image-test`: build the serving image with podman from a locally built Debian base, run it, check it.

1. base: mmdebstrap's bookworm (cached under build/container/), imported with podman (scripts/image_check/base.py);
2. build: the Dockerfile with BASE= that base, this machine's pip settings, local wheels and CA bundle mounted
   read-only (scripts/image_check/pip_settings.py): the CPU torch here, the CUDA one from PyPI elsewhere;
3. run: detached, as the image's non-root user, the host's network (podman's other network modes need
   privileges this sandbox lacks) with every listener moved to free loopback ports, a new named key volume;
   The image's size must be at most MAX_IMAGE_BYTES (1.5 GB, the CPU build of torch here; checked last).
4. healthy: `podman healthcheck run` (the image's HEALTHCHECK) passes; every process in it is non-root; the entry
   point's warm-up record (/keys/warmed-up.json, which the HEALTHCHECK waits for) names every lane the image
   loads, each answered, after a wrk burst of thousands of requests (wrk is in the image);
5. answers, through the image's front door (nginx; a form body refused there with a 415): the token from the key
   volume; every model (models/) answers each of its samples as samples.json says; each archive in the image is
   the tested model_store/<model>.mar (same sha256), and its first sample's answer equals the in-process core's on
   that archive within 1e-5 (every number; labels exactly);
6. keys: the container runs with keys that expire after 30 s (its own config with token_expiration_min=0.5,
   mounted); it stays healthy for
   three minutes past that (the health check renews them), and a sample with the renewed key is answered;
7. stop: `podman stop --time 30` (SIGTERM, SIGKILL after 30 s): exit status 0, in under 30 s, key removed.

Figures go to build/container/image-test.json.

    python -m scripts.image_check.image_test [--no-cache] [--remove-image]
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import orjson

from models import registry
from scripts import cli
from scripts.archive.core import load_core
from scripts.archive.reader import MarFile
from scripts.clients.rest import predict
from scripts.container.config import WARMED_MARKER, listener_environment
from scripts.image_check.base import BASE_IMAGE, ensure_base
from scripts.image_check.pip_settings import ca_bundle, read_pip_settings
from scripts.image_check.podman import ContainerError, Podman
from scripts.jobs.runners import InProcessRunner
from scripts.layout import BUILD, CONFIG, JSON, MODEL_STORE, ROOT
from scripts.server.config import FRONT_DOOR_LISTENERS, ServerConfig
from scripts.server.endpoints import Endpoints, read_key
from scripts.server.process import free_port, free_ports
from scripts.server.warmup import burst_lane

IMAGE = "localhost/unified-serve:test"
WORK = BUILD / "container"
# The largest difference between a number the container answers and the in-process core's, on the same archive.
SERVED_TOLERANCE = 1e-5
BUILD_TIMEOUT_S = 3600
HEALTHY_TIMEOUT_S = 300
# podman's and Kubernetes' default grace period: SIGTERM, then SIGKILL (exit 137) when it runs out.
STOP_GRACE_S = 30
KEY_IN_IMAGE = "/keys"
STOP_LINES = ("SIGTERM: ", "TorchServe stopped", "killing ")  # scripts/container/entrypoint.py's account
STORE_IN_IMAGE = "/srv/model_store"
IMAGE_CONFIG = "/srv/config.container.properties"
EXPIRING_CONFIG_IN_IMAGE = "/srv/config.expiring.properties"
# The serving image's budget (docs/container.md gives its layers): a guard that fails if the tools and tests creep
# back into the image.
MAX_IMAGE_BYTES = 1_500_000_000
# The serving layer's lock for this machine: torch's CPU wheel (the Dockerfile's default is PyPI's CUDA build).
SERVING_LOCK = "locks/serving-cpu.txt"
# Keys that expire within a minute, and how long the container must stay healthy after they first expire.
KEY_LIFETIME_MIN = "0.5"
HEALTHY_PAST_EXPIRY_S = 180
HEALTH_INTERVAL_S = 15


class ImageTestError(ContainerError):
    """The image built and ran, but answered, ran or stopped other than it should."""


@dataclass
class Figures:
    base_s: float = 0.0
    build_s: float = 0.0
    image_bytes: int = 0
    healthy_s: float = 0.0
    warm_up_requests: int = 0  # what the entry point's warm-up sent before the HEALTHCHECK could pass
    warm_up_failed: int = 0  # of them not answered 200 (keys expiring every 30 s here can refuse some)
    form_status: int = 0  # the front door's answer to a form body (415)
    samples_answered: dict = field(default_factory=dict)  # {model: samples answered as samples.json says}
    served_vs_in_process: dict = field(default_factory=dict)  # {model: largest difference of its first sample's answer}
    keys_seen: int = 0  # distinct inference keys in the key file while it stayed healthy past their expiry
    healthy_past_expiry_s: float = 0.0
    stop_s: float = 0.0
    exit_code: int = -1
    stop_log: str = ""  # the entry point's own account of the stop


@dataclass(frozen=True)
class Container:
    name: str
    keys: Path  # the key volume, as this machine sees it
    endpoints: Endpoints


def build_image(podman: Podman, base: str, no_cache: bool) -> float:
    settings = read_pip_settings()
    conf = WORK / "pip.conf"
    conf.write_text(settings.conf_text())
    shared = sorted({*settings.local_paths(), *filter(None, [ca_bundle()])})
    volumes = [f"--volume={conf}:/etc/pip.conf:ro", *(f"--volume={path}:{path}:ro" for path in shared)]
    started = time.monotonic()
    podman.stream(
        "build",
        "--format=docker",  # OCI images drop HEALTHCHECK
        "--network=host",
        f"--build-arg=BASE={base}",
        f"--build-arg=SERVING_LOCK={SERVING_LOCK}",
        *volumes,
        *(["--no-cache"] if no_cache else []),
        f"--tag={IMAGE}",
        f"--file={ROOT / 'Dockerfile'}",
        str(ROOT),
        timeout=BUILD_TIMEOUT_S,
    )
    return time.monotonic() - started


@contextlib.contextmanager
def running(podman: Podman) -> Iterator[Container]:
    """The image started with a new key volume on free ports; container and volume removed on the way out."""
    name = f"unified-serve-test-{os.getpid()}"
    volume = f"{name}-keys"
    ports = free_ports()
    door = {name: free_port() for name in FRONT_DOOR_LISTENERS}  # where clients connect: the image's front door
    podman.run("volume", "create", volume)
    try:
        keys = Path(podman.inspect("volume", volume)["Mountpoint"])
        environment = [f"--env={key}={value}" for key, value in listener_environment(ports, door).items()]
        config = f"--volume={expiring_config(podman)}:{EXPIRING_CONFIG_IN_IMAGE}:ro"
        options = [f"--name={name}", "--network=host", f"--volume={volume}:{KEY_IN_IMAGE}", config, *environment]
        command = ["/srv/.venv/bin/python", "-m", "scripts.container.entrypoint", "--ts-config", EXPIRING_CONFIG_IN_IMAGE]
        podman.run("run", "--detach", *options, IMAGE, *command, "--key-dir", KEY_IN_IMAGE)
        endpoints = Endpoints(
            inference=f"http://127.0.0.1:{door['inference']}",
            management=f"http://127.0.0.1:{door['management']}",
            metrics=f"http://127.0.0.1:{door['metrics']}",
            grpc_host="127.0.0.1",
            grpc_inference_port=door["grpc_inference"],
            grpc_management_port=door["grpc_management"],
            key_file=keys / "key_file.json",
        )
        yield Container(name, keys, endpoints)
    finally:
        podman.run("rm", "--force", name, check=False)
        podman.run("volume", "rm", "--force", volume, check=False)


def expiring_config(podman: Podman) -> Path:
    """The image's own config.properties with keys that expire after KEY_LIFETIME_MIN minutes (TorchServe reads
    token_expiration_min from the file only: TS_TOKEN_EXPIRATION_MIN in the environment is not applied)."""
    text = podman.run("run", "--rm", "--entrypoint=cat", IMAGE, IMAGE_CONFIG).stdout
    changed, count = re.subn(r"(?m)^token_expiration_min=.*$", f"token_expiration_min={KEY_LIFETIME_MIN}", text)
    if count != 1:
        raise ImageTestError(f"{IMAGE_CONFIG} in the image has {count} token_expiration_min lines, expected 1")
    path = WORK / "config.expiring.properties"
    path.write_text(changed)
    path.chmod(0o644)  # read by the image's user
    return path


def logs_tail(podman: Podman, name: str, lines: int = 40) -> str:
    done = podman.run("logs", "--tail", str(lines), name, check=False)
    return (done.stdout + done.stderr).strip()


def wait_healthy(podman: Podman, name: str, timeout: float = HEALTHY_TIMEOUT_S) -> float:
    started = time.monotonic()
    while podman.run("healthcheck", "run", name, check=False, timeout=60).returncode != 0:
        state = podman.inspect("container", name)["State"]
        if not state["Running"]:
            raise ImageTestError(f"the container exited ({state['ExitCode']}) before it was healthy:\n{logs_tail(podman, name)}")
        if time.monotonic() - started > timeout:
            raise ImageTestError(f"not healthy after {timeout:.0f}s:\n{logs_tail(podman, name)}")
        time.sleep(2)
    return time.monotonic() - started


def check_non_root(podman: Podman, name: str) -> None:
    """No process in the container runs as root (tini, the entry point, Java, the workers)."""
    rows = podman.run("top", name, "user", "args").stdout.splitlines()[1:]
    root = [row for row in rows if row.split()[0] in ("root", "0")]
    if root or not rows:
        raise ImageTestError(f"processes running as root in the container: {root or 'none listed'}")


def check_warmed(container: Container, figures: Figures) -> None:
    """The entry point warmed every lane, and found each answering its model's samples, before the HEALTHCHECK
    passed: its record in the key volume."""
    path = container.keys / WARMED_MARKER
    record = json.loads(path.read_text()) if path.exists() else {}
    warmed = record.get("warm_ups", [])
    lanes = sorted(ServerConfig.read(CONFIG).lanes())
    answered = sorted({w["lane"] for w in warmed if w["requests"] > w["failed"]})
    burst = warmed[0] if warmed else {}
    expected_burst = burst_lane(lanes)
    if answered != lanes or burst.get("lane") != expected_burst or burst.get("requests", 0) - burst.get("failed", 0) < 1000:
        raise ImageTestError(f"the warm-up record {path} does not show a wrk burst and every lane {lanes} answered: {record}")
    gated = record.get("samples", {})
    if sorted(gated) != lanes or record.get("failed_gates") != []:
        raise ImageTestError(f"the warm-up record {path} does not show every lane {lanes} passing its samples gate: {record}")
    figures.warm_up_requests = sum(w["requests"] for w in warmed)
    figures.warm_up_failed = sum(w["failed"] for w in warmed)


def served_answer(endpoints: Endpoints, found: registry.Model, position: int):
    """The container's answer to the model's sample `position`, through its stream lane; a non-200 fails the test."""
    lane = found.stream_lane.name
    body = orjson.dumps({"instances": [found.samples().instances[position]]})
    reply = predict(endpoints, lane, body, JSON, timeout=60)
    if reply.status_code != 200:
        raise ImageTestError(f"{lane}: sample {position} got HTTP {reply.status_code} {reply.text[:300]}")
    return reply.json()["predictions"][0]


def check_one_sample(endpoints: Endpoints) -> None:
    """The first model's first sample, answered as samples.json says (after the keys were renewed)."""
    found = next(iter(registry.models().values()))
    samples = found.samples()
    problem = samples.problem(served_answer(endpoints, found, 0), samples.answers[0])
    if problem:
        raise ImageTestError(f"{found.stream_lane.name}: sample 0: {problem}")


def check_samples(endpoints: Endpoints, figures: Figures) -> None:
    """Every model the folders declare answers each of its samples in the container as samples.json says."""
    for name, found in registry.models().items():
        samples = found.samples()
        figures.samples_answered[name] = sum(
            samples.problem(served_answer(endpoints, found, position), answer) is None
            for position, answer in enumerate(samples.answers)
        )
        if figures.samples_answered[name] < samples.min_agreement * len(samples.instances):
            raise ImageTestError(
                f"{found.stream_lane.name}: {figures.samples_answered[name]} of {len(samples.instances)} samples answered "
                "as expected"
            )


def check_front_door(endpoints: Endpoints, figures: Figures) -> None:
    """Clients meet the image's front door (nginx): a form body is refused there, before TorchServe's frontend."""
    lane = next(lane.name for lane in registry.lanes() if lane.bulk)
    reply = predict(endpoints, lane, b"a=&" * 1000, "application/x-www-form-urlencoded", timeout=60)
    figures.form_status = reply.status_code
    if reply.status_code != 415 or reply.json().get("type") != "UnsupportedMediaType":
        raise ImageTestError(
            f"a form body through the image's front door: expected 415, got HTTP {reply.status_code} {reply.text[:300]}"
        )


def check_served_archives(podman: Podman, container: Container, figures: Figures) -> None:
    """Each model's archive in the image is the tested one, and answers its first sample as the in-process core
    does on that archive."""
    for name, found in registry.models().items():
        tested = MODEL_STORE / f"{name}.mar"
        served_archive = WORK / f"{name}-from-image.mar"
        podman.run("cp", f"{container.name}:{STORE_IN_IMAGE}/{name}.mar", str(served_archive))
        digest = MarFile(tested).verify_digest()
        if MarFile(served_archive).sha256() != digest:
            raise ImageTestError(f"the image's {STORE_IN_IMAGE}/{name}.mar is not the tested {tested} (sha256 {digest})")
        served = served_answer(container.endpoints, found, 0)
        expected = InProcessRunner(load_core(tested), tested).send([found.samples().instances[0]]).body["predictions"][0]
        difference = figures.served_vs_in_process[name] = registry.largest_difference(served, expected)
        if not difference <= SERVED_TOLERANCE:
            raise ImageTestError(
                f"{name}: the container's answer to sample 0 differs from the in-process core's by {difference:.3g} "
                f"(allowed {SERVED_TOLERANCE}): {str(served)[:200]} against {str(expected)[:200]}"
            )


def survive_key_expiry(podman: Podman, container: Container, figures: Figures) -> None:
    """Healthy at every check for HEALTHY_PAST_EXPIRY_S after the first key expired; then answered with the new key."""
    first = read_key(container.endpoints.key_file, "inference", fresh=True)
    if first.expires is None or (first.expires - datetime.now(UTC)).total_seconds() > 90:
        raise ImageTestError(f"the keys do not expire within a minute (token_expiration_min={KEY_LIFETIME_MIN}): {first.expires}")
    time.sleep(max(0.0, (first.expires - datetime.now(UTC)).total_seconds()) + 1)
    keys, started = {first.value}, time.monotonic()
    while (elapsed := time.monotonic() - started) < HEALTHY_PAST_EXPIRY_S:
        check = podman.run("healthcheck", "run", container.name, check=False, timeout=60)
        if check.returncode != 0:
            raise ImageTestError(
                f"unhealthy {elapsed:.0f}s after the keys first expired ({len(keys)} inference keys so far):\n"
                f"{check.stdout}{check.stderr}\n{logs_tail(podman, container.name)}"
            )
        keys.add(read_key(container.endpoints.key_file, "inference", fresh=True).value)
        time.sleep(HEALTH_INTERVAL_S)
    figures.healthy_past_expiry_s = time.monotonic() - started
    check_one_sample(container.endpoints)  # the client renews or reads the renewed key from the volume
    keys.add(read_key(container.endpoints.key_file, "inference", fresh=True).value)
    figures.keys_seen = len(keys)
    if figures.keys_seen < 2:
        raise ImageTestError("the inference key was never renewed although it expired")


def stop(podman: Podman, container: Container, figures: Figures) -> None:
    started = time.monotonic()
    podman.run("stop", f"--time={STOP_GRACE_S}", container.name, timeout=STOP_GRACE_S + 30)
    figures.stop_s = time.monotonic() - started
    figures.exit_code = podman.inspect("container", container.name)["State"]["ExitCode"]
    figures.stop_log = "; ".join(
        line for line in logs_tail(podman, container.name, 20).splitlines() if line.startswith(STOP_LINES)
    )
    if figures.exit_code != 0:
        raise ImageTestError(
            f"SIGTERM: exit status {figures.exit_code} after {figures.stop_s:.1f}s, expected 0 "
            f"(137: killed after the {STOP_GRACE_S}s grace):\n{logs_tail(podman, container.name)}"
        )
    if (container.keys / "key_file.json").exists():
        raise ImageTestError("TorchServe stopped without removing key_file.json: the stop did not go through `torchserve --stop`")


def image_test(no_cache: bool = False, keep_image: bool = True) -> Figures:
    figures = Figures()
    podman = Podman.prepare(WORK)
    figures.base_s = ensure_base(podman, WORK)
    figures.build_s = build_image(podman, BASE_IMAGE, no_cache)
    figures.image_bytes = int(podman.inspect("image", IMAGE)["Size"])
    print(f"image {IMAGE}: {figures.image_bytes / 2**30:.2f} GiB, built in {figures.build_s:.0f}s", flush=True)
    try:
        with running(podman) as container:
            figures.healthy_s = wait_healthy(podman, container.name)
            print(f"healthy after {figures.healthy_s:.0f}s", flush=True)
            check_non_root(podman, container.name)
            check_warmed(container, figures)
            print(f"warmed with {figures.warm_up_requests:,} requests ({figures.warm_up_failed} failed)", flush=True)
            check_samples(container.endpoints, figures)
            print(f"every model answers its samples: {figures.samples_answered}", flush=True)
            check_front_door(container.endpoints, figures)
            check_served_archives(podman, container, figures)
            survive_key_expiry(podman, container, figures)
            print(f"healthy {figures.healthy_past_expiry_s:.0f}s past key expiry ({figures.keys_seen} keys)", flush=True)
            stop(podman, container, figures)
    finally:
        if not keep_image:
            podman.run("rmi", "--force", IMAGE, check=False)
    # Checked last, so a run over budget still says whether the image serves.
    if figures.image_bytes > MAX_IMAGE_BYTES:
        raise ImageTestError(f"the image is {figures.image_bytes:,} bytes, over its budget of {MAX_IMAGE_BYTES:,}")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--no-cache", action="store_true", help="rebuild every layer (a cold build)")
    parser.add_argument("--remove-image", action="store_true", help="remove the image afterwards (the base stays)")
    args = parser.parse_args(argv)
    figures = image_test(args.no_cache, keep_image=not args.remove_image)
    (WORK / "image-test.json").write_text(json.dumps(asdict(figures), indent=2) + "\n")
    print(
        f"image-test passed: base {figures.base_s:.0f}s, build {figures.build_s:.0f}s, "
        f"{figures.image_bytes / 2**30:.2f} GiB, healthy after {figures.healthy_s:.0f}s, samples answered "
        f"{figures.samples_answered}, against the in-process cores {figures.served_vs_in_process}, "
        f"SIGTERM -> exit {figures.exit_code} in {figures.stop_s:.1f}s ({figures.stop_log})"
    )
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
