"""config.properties for the cluster, generated from the repository's (the one source of lanes and batching).

    python -m scripts.deploy.render k8s                      # deploy/k8s/config/ (committed; kustomize reads it)
    python -m scripts.deploy.render kserve --out build/kserve # the bucket KServe's storage initializer copies

Both keep every setting of config.properties (lanes, batching, limits, security) and change only where
things are in the container and who may connect (docs/kubernetes.md): TorchServe's APIs on loopback (the
pod's gateway is the only client, with the pod's own key), metrics on all interfaces for Prometheus, the model
store and metrics config where the pod mounts them (deploy/k8s: its volumes; deploy/kserve: /mnt/models, where
KServe's storage initializer puts the bucket). One gateway config serves both pods.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from scripts import cli
from scripts.archive.reader import MarFile
from scripts.deploy.manifests import K8S
from scripts.errors import ConfigError
from scripts.layout import BUILD, CONFIG
from scripts.server import front_door
from scripts.server.config import ServerConfig
from scripts.server.front_door import torchserve_addresses
from scripts.server.prometheus import MONITORING

K8S_CONFIG = K8S / "config"
GATEWAY_CONF = K8S / "gateway" / "nginx.conf"
METRICS = MONITORING / "metrics.yaml"
LOG_CONFIG = MONITORING / "log4j2.xml"  # TorchServe's logging (config.properties' vmargs), beside metrics.yaml
# TorchServe's default ports: render() takes them for the keys it always writes.
PORTS = {"inference": 8080, "management": 8081, "metrics": 8082, "grpc_inference": 7070, "grpc_management": 7071, "workers": 9000}

# Where the Deployment mounts things (deploy/k8s/deployment.yaml; docs/kubernetes.md names them for the image).
POD_HOME = "/home/model-server"
K8S_OVERRIDES = {
    "inference_address": "http://127.0.0.1:8080",
    "management_address": "http://127.0.0.1:8081",
    "metrics_address": "http://0.0.0.0:8082",
    "grpc_inference_address": "127.0.0.1",
    "grpc_management_address": "127.0.0.1",
    "model_store": f"{POD_HOME}/model-store",
    "metrics_config": f"{POD_HOME}/config/metrics.yaml",
    # The keys never leave the pod (only its gateway and probes read them): a pod older than a year restarts
    # when its probes' key expires, instead of every day.
    "token_expiration_min": "525600",
}

# KServe's storage initializer puts the bucket at /mnt/models (deploy/kserve/inferenceservice.yaml's STORAGE_URI).
KSERVE_MOUNT = "/mnt/models"
KSERVE_OVERRIDES = {
    **K8S_OVERRIDES,
    "model_store": f"{KSERVE_MOUNT}/model-store",
    "metrics_config": f"{KSERVE_MOUNT}/config/metrics.yaml",
}


def _log_config_at(source: ServerConfig, folder: str) -> dict[str, str]:
    vmargs = source.vmargs_with_log_config(lambda value: f"{folder}/{Path(value).name}")
    return {"vmargs": vmargs} if vmargs else {}


def k8s_properties(source: ServerConfig) -> str:
    overrides = {**K8S_OVERRIDES, **_log_config_at(source, f"{POD_HOME}/config")}
    return _render(source, overrides, "deploy/k8s: TorchServe inside a pod behind its gateway")


def kserve_properties(source: ServerConfig) -> str:
    overrides = {**KSERVE_OVERRIDES, **_log_config_at(source, f"{KSERVE_MOUNT}/config")}
    return _render(source, overrides, "deploy/kserve: the project's image as KServe's custom predictor")


def _render(source: ServerConfig, overrides: dict[str, str], purpose: str) -> str:
    with tempfile.TemporaryDirectory() as folder:
        rendered = source.render(Path(folder) / "config.properties", Path(overrides["model_store"]), PORTS, overrides)
        lines = rendered.read_text().splitlines()
    # The source's comments describe `make serve` on one machine; they stay there.
    settings = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    header = [
        f"# Generated from config.properties by `python -m scripts.deploy.render` for {purpose}.",
        "# Do not edit: change config.properties and render again (tests/unit/deploy/test_manifests.py checks).",
    ]
    return "\n".join(header + settings) + "\n"


def gateway_conf(source: ServerConfig) -> str:
    """The pod's gateway: the front door of `make serve` (scripts/server/front_door.py) in its gateway mode, before
    the TorchServe of the pod's config.properties."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.properties"
        path.write_text(k8s_properties(source))
        pod = ServerConfig.read(path)
        return front_door.render(pod, {}, {}, gateway=front_door.Gateway(upstream=torchserve_addresses(pod)["inference"]))


def write_k8s(source: ServerConfig, folder: Path = K8S_CONFIG) -> list[Path]:
    """config.properties, metrics.yaml and log4j2.xml for the ConfigMap that kustomize generates from this folder,
    and the gateway's nginx.conf."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.properties").write_text(k8s_properties(source))
    shutil.copyfile(METRICS, folder / "metrics.yaml")
    shutil.copyfile(LOG_CONFIG, folder / "log4j2.xml")
    GATEWAY_CONF.write_text(gateway_conf(source))
    return [folder / "config.properties", folder / "metrics.yaml", folder / "log4j2.xml", GATEWAY_CONF]


def write_kserve(source: ServerConfig, out: Path) -> list[Path]:
    """The bucket layout: config/config.properties, config/metrics.yaml, model-store/<each archive the lanes load>
    with its <archive>.sha256, each checked against the sha256 `make archive` recorded before it is copied."""
    (out / "config").mkdir(parents=True, exist_ok=True)
    (out / "model-store").mkdir(parents=True, exist_ok=True)
    (out / "config" / "config.properties").write_text(kserve_properties(source))
    shutil.copyfile(METRICS, out / "config" / "metrics.yaml")
    shutil.copyfile(LOG_CONFIG, out / "config" / "log4j2.xml")
    written = [out / "config" / "config.properties", out / "config" / "metrics.yaml", out / "config" / "log4j2.xml"]
    for archive in sorted(set(source.loaded_lanes().values())):
        built = MarFile(source.model_store / archive)
        if not built.path.is_file():
            raise ConfigError(f"{built.path} is missing: run `make archive` first")
        built.verify_digest()  # only what `make archive` built goes into the bucket, with its recorded sha256
        copied = built.copy(out / "model-store" / archive)
        written += [copied.path, copied.digest_file]
    return written


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("target", choices=("k8s", "kserve"))
    parser.add_argument("--config", type=Path, default=CONFIG, help="the source config.properties")
    parser.add_argument("--out", type=Path, default=BUILD / "kserve", help="kserve: where to assemble the bucket layout")
    args = parser.parse_args()
    source = ServerConfig.read(args.config)
    written = write_k8s(source) if args.target == "k8s" else write_kserve(source, args.out)
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    cli.run(main)
