"""deploy/: the Kubernetes manifests (kubernetes-validate, strict, Kubernetes 1.34), the InferenceService (KServe's
own CRD schema, strict), the cluster's config.properties (generated from the repository's and kept equal to it),
and the contracts between the pieces: probes, mounts, ports, the gateway, the HPA's metric."""

from __future__ import annotations

import copy
import json
import re
import subprocess

import jsonschema
import pytest
import yaml

from handlers.priority import PASSIVE, SPIN_GRACE
from handlers.settings import HandlerSettings
from models import registry
from scripts.archive.reader import MarFile
from scripts.deploy import memory
from scripts.deploy.manifests import (
    K8S,
    KSERVE,
    KSERVE_SCHEMA,
    ManifestError,
    load_documents,
    strict,
    validate,
    validate_inference_service,
)
from scripts.deploy.memory import (
    FRONTEND_HEAP_BASE_MIB,
    GATEWAY_CONF,
    JVM_NATIVE_MIB,
    WORKER_PEAK_MIB,
    bulk_admitted,
    derive,
    gateway_limits,
    jvm_flags,
    summary,
)
from scripts.deploy.render import K8S_CONFIG, METRICS, gateway_conf, k8s_properties, kserve_properties, write_kserve
from scripts.layout import CONFIG, ROOT
from scripts.server.config import ServerConfig
from scripts.server.prometheus import binary, metric_names
from tests.unit.monitoring.test_monitoring import declared_series

CORE_MANIFESTS = [
    "deployment.yaml",
    "service.yaml",
    "autoscaling/hpa.yaml",
    "pvc.yaml",
    "model-store-loader.yaml",
    "prometheus-adapter.yaml",
]
MODELS = ("digits", "minilm")


def one(path):
    documents = load_documents(path)
    assert len(documents) == 1, path
    return documents[0]


@pytest.fixture(scope="module")
def deployment() -> dict:
    return one(K8S / "deployment.yaml")


@pytest.fixture(scope="module")
def containers(deployment) -> dict[str, dict]:
    return {container["name"]: container for container in deployment["spec"]["template"]["spec"]["containers"]}


@pytest.fixture(scope="module")
def inference_service() -> dict:
    return one(KSERVE / "inferenceservice.yaml")


@pytest.fixture(scope="module")
def pod_config() -> ServerConfig:
    return ServerConfig.read(K8S_CONFIG / "config.properties")


def kustomization(root=K8S) -> dict:
    return yaml.safe_load((root / "kustomization.yaml").read_text())


def generated_config_maps(root=K8S) -> list[dict]:
    """The ConfigMaps `kubectl apply -k root` generates (before hashing): its configMapGenerator's and those of the
    kustomizations it lists among its resources."""
    maps = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": entry["name"]},
            "data": {file.rsplit("/", 1)[-1]: (root / file).read_text() for file in entry["files"]},
        }
        for entry in kustomization(root).get("configMapGenerator", [])
    ]
    for resource in kustomization(root).get("resources", []):
        if (root / resource).is_dir():
            maps += generated_config_maps((root / resource).resolve())
    return maps


def listed_documents(root) -> list[dict]:
    """Every document `kubectl apply -k root` reads from files (resources, recursively), before patches."""
    documents = []
    for resource in kustomization(root).get("resources", []):
        path = root / resource
        documents += listed_documents(path) if path.is_dir() else load_documents(path)
    return documents


# -- validity --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CORE_MANIFESTS)
def test_core_manifests_are_valid_in_strict_mode(name):
    for document in load_documents(K8S / name):
        validate(document)


def test_the_kustomization_lists_existing_files_and_its_config_maps_are_valid():
    listed = kustomization()["resources"]
    assert set(listed) == {"pvc.yaml", "deployment.yaml", "service.yaml", "autoscaling", "gateway"}
    assert all((K8S / name).exists() for name in listed)
    kinds = sorted(document["kind"] for document in listed_documents(K8S))
    assert kinds == ["Deployment", "HorizontalPodAutoscaler", "PersistentVolumeClaim", "Service"]
    maps = generated_config_maps()
    assert {m["metadata"]["name"] for m in maps} == {"torchserve-config", "gateway"}
    for config_map in maps:
        validate(config_map)


# Fields of KServe's PredictorSpec beside the pod's own (the rest of it is a core PodSpec).
KSERVE_PREDICTOR_FIELDS = {"minReplicas", "maxReplicas", "scaleMetric", "scaleTarget", "timeout", "deploymentStrategy"}


def test_the_inference_service_is_valid_against_kserves_schema_and_its_predictor_as_a_core_pod(inference_service):
    validate(inference_service)
    predictor = inference_service["spec"]["predictor"]
    pod_spec = {key: value for key, value in predictor.items() if key not in KSERVE_PREDICTOR_FIELDS}
    # The stricter core schema of Kubernetes 1.34 for what KServe turns into the predictor's pod.
    validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unified-serve-predictor"}, "spec": pod_spec})


def test_the_kserve_kustomization_takes_the_gateway_and_the_hpa_from_deploy_k8s(inference_service):
    listed = kustomization(KSERVE)["resources"]
    assert set(listed) == {"../k8s/gateway", "../k8s/autoscaling", "inferenceservice.yaml"}
    assert sorted(d["kind"] for d in listed_documents(KSERVE)) == ["HorizontalPodAutoscaler", "InferenceService"]
    assert [m["metadata"]["name"] for m in generated_config_maps(KSERVE)] == ["gateway"]
    # kustomize writes the ConfigMap's hashed name where its configurations say an InferenceService names it.
    (reference,) = yaml.safe_load((KSERVE / "kustomizeconfig.yaml").read_text())["nameReference"]
    (field,) = reference["fieldSpecs"]
    assert (reference["kind"], field["kind"], field["group"]) == ("ConfigMap", "InferenceService", "serving.kserve.io")
    nodes = [inference_service]
    for part in field["path"].split("/"):
        nodes = [item for node in nodes for item in (node if isinstance(node, list) else [node]) if part in item]
        nodes = [node[part] for node in nodes]
    assert nodes == ["gateway"]
    # The HPA scales KServe's Deployment of the predictor, <name>-predictor in raw deployment mode.
    (patch,) = kustomization(KSERVE)["patches"]
    hpa = one(K8S / "autoscaling" / "hpa.yaml")
    assert patch["target"] == {"kind": "HorizontalPodAutoscaler", "name": hpa["metadata"]["name"]}
    assert yaml.safe_load(patch["patch"]) == [
        {"op": "replace", "path": "/spec/scaleTargetRef/name", "value": f"{inference_service['metadata']['name']}-predictor"}
    ]


def broken(document: dict, path: tuple, value=None, delete: bool = False) -> dict:
    """A copy of `document` with the field at `path` (keys and list indexes) set to `value`, or deleted."""
    copied = copy.deepcopy(document)
    *parents, last = path
    node = copied
    for part in parents:
        node = node[part]
    if delete:
        del node[last]
    else:
        node[last] = value
    return copied


CONTAINER = ("spec", "template", "spec", "containers")
PREDICTOR = ("spec", "predictor", "containers")
BROKEN_DEPLOYMENTS = {
    "a misspelled probe field": (CONTAINER + (0, "livenessProbes"), {}, "livenessProbes"),
    "a GPU count that is a list": (CONTAINER + (0, "resources", "limits", "nvidia.com/gpu"), [1], "nvidia.com/gpu"),
    "a port given as text": (CONTAINER + (1, "ports", 0, "containerPort"), "8000", "containerPort"),
    "an unknown kind": (("kind",), "Deploymnet", "Couldn't find schema for kind Deploymnet"),
}
BROKEN_INFERENCE_SERVICES = {
    "a misspelled probe field": (PREDICTOR + (0, "livenessProbes"), {}, "'livenessProbes' was unexpected"),
    "a container without a name": (PREDICTOR + (1, "name"), None, "'name' is a required property"),
    "a misspelled metadata field": (("metadata", "lables"), {}, "'lables' was unexpected"),
    "replicas as text": (("spec", "predictor", "minReplicas"), "one", "not of type 'integer'"),
}


@pytest.mark.parametrize("case", BROKEN_DEPLOYMENTS, ids=list(BROKEN_DEPLOYMENTS))
def test_a_broken_deployment_is_refused_with_the_field_named(deployment, case):
    path, value, named = BROKEN_DEPLOYMENTS[case]
    with pytest.raises(ManifestError, match=re.escape(named)):
        validate(broken(deployment, path, value))


@pytest.mark.parametrize("case", BROKEN_INFERENCE_SERVICES, ids=list(BROKEN_INFERENCE_SERVICES))
def test_a_broken_inference_service_is_refused_with_the_field_named(inference_service, case):
    path, value, named = BROKEN_INFERENCE_SERVICES[case]
    with pytest.raises(ManifestError, match=re.escape(named)):
        validate(broken(inference_service, path, value, delete=value is None))


def test_strictness_refuses_what_the_crd_alone_would_silently_prune(inference_service):
    schema = json.loads(KSERVE_SCHEMA.read_text())
    typo = broken(inference_service, PREDICTOR + (0, "livenessProbes"), {})
    # As published, the CRD lets the API server drop unknown fields without a word: the typo passes.
    jsonschema.Draft202012Validator(schema).validate({**typo, "metadata": {}})
    with pytest.raises(ManifestError):
        validate_inference_service(typo)
    # Where the CRD keeps unknown fields on purpose, strict() leaves the object open.
    node = {"type": "object", "properties": {"a": {"type": "string"}}, "x-kubernetes-preserve-unknown-fields": True}
    assert "additionalProperties" not in strict(node)
    assert strict({"type": "object", "properties": {"a": {}}})["additionalProperties"] is False


def test_the_kserve_schema_names_its_source_release_and_commit():
    comment = json.loads(KSERVE_SCHEMA.read_text())["$comment"]
    assert re.search(r"kserve/kserve v\d+\.\d+\.\d+ \(commit [0-9a-f]{40}\)", comment)
    commit = re.search(r"[0-9a-f]{40}", comment).group(0)
    assert commit in (KSERVE_SCHEMA.parent / "README.md").read_text()


# -- config.properties in the cluster ----------------------------------------------------------------------------


def test_the_pod_config_is_generated_from_the_repositorys_and_up_to_date():
    assert (K8S_CONFIG / "config.properties").read_text() == k8s_properties(ServerConfig.read()), (
        "run `python -m scripts.deploy.render k8s`"
    )
    assert (K8S_CONFIG / "metrics.yaml").read_bytes() == METRICS.read_bytes(), "run `python -m scripts.deploy.render k8s`"


@pytest.mark.parametrize("target", ["k8s", "kserve"])
def test_the_cluster_configs_keep_the_lanes_batching_and_limits(target, tmp_path):
    source = ServerConfig.read()
    path = tmp_path / "config.properties"
    path.write_text(k8s_properties(source) if target == "k8s" else kserve_properties(source))
    rendered = ServerConfig.read(path)
    assert rendered.loaded_lanes() == source.loaded_lanes()
    assert rendered._models_json() == source._models_json()
    for model in MODELS:
        assert rendered.lane_settings(model) == source.lane_settings(model)
    assert rendered.max_request_size == source.max_request_size
    for key in ("max_response_size", "metrics_mode", "model_metrics_auto_detect", "enable_model_api", "allowed_urls"):
        assert rendered.get(key, "") == source.get(key, "unset"), key


def test_the_pod_config_keeps_token_authorization_and_tells_where_things_are_mounted(pod_config, containers):
    assert pod_config.get("disable_token_authorization", "") == "false"
    # Only the pod's gateway and probes talk to TorchServe; Prometheus scrapes the metrics port from outside.
    for key in ("inference_address", "management_address"):
        assert pod_config.get(key, "").startswith("http://127.0.0.1:"), key
    assert pod_config.get("grpc_inference_address", "") == "127.0.0.1"
    assert pod_config.get("metrics_address", "") == "http://0.0.0.0:8082"
    mounts = {mount["name"]: mount["mountPath"] for mount in containers["torchserve"]["volumeMounts"]}
    args = containers["torchserve"]["args"]
    assert args[args.index("--ts-config") + 1] == f"{mounts['config']}/config.properties"
    assert args[:3] == ["python", "-m", "scripts.container.entrypoint"]  # the image's clean-stopping command
    assert args[args.index("--key-dir") + 1] == "/keys"
    assert mounts["model-store"] == pod_config.get("model_store", "")
    assert pod_config.get("metrics_config", "") == f"{mounts['config']}/metrics.yaml"


def test_the_kserve_config_is_the_pods_with_the_bucket_at_mnt_models():
    def settings(text: str) -> dict[str, str]:
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))

    source = ServerConfig.read()
    kserve, pod = settings(kserve_properties(source)), settings(k8s_properties(source))
    moved = {key for key in pod if pod[key] != kserve.get(key)}
    assert set(kserve) == set(pod) and moved == {"model_store", "metrics_config", "vmargs"}
    assert kserve["model_store"] == "/mnt/models/model-store"
    assert kserve["metrics_config"] == "/mnt/models/config/metrics.yaml"
    assert kserve["vmargs"] == pod["vmargs"].replace("/home/model-server/config/", "/mnt/models/config/")
    # Token authorization stays on: the gateway forwards with the pod's key, so one gateway config fits both pods.
    assert kserve["disable_token_authorization"] == "false"
    assert kserve["inference_address"] == "http://127.0.0.1:8080"


def test_the_kserve_bucket_layout_holds_config_and_every_loaded_archive(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    archives = [f"{name}.mar" for name in registry.models()]
    for name in archives:
        (store / name).write_bytes(b"archive " + name.encode())
        MarFile(store / name).record_digest()  # what `make archive` writes; the bucket takes only recorded archives
    config = ServerConfig.read().render(
        tmp_path / "config.properties",
        store,
        {"inference": 1, "management": 2, "metrics": 3, "grpc_inference": 4, "grpc_management": 5, "workers": 6},
    )
    written = write_kserve(ServerConfig.read(config), tmp_path / "bucket")
    layout = sorted(str(path.relative_to(tmp_path / "bucket")) for path in written)
    stored = [f"model-store/{name}{suffix}" for name in archives for suffix in ("", ".sha256")]
    assert layout == ["config/config.properties", "config/log4j2.xml", "config/metrics.yaml", *sorted(stored)]
    assert {"model-store/digits.mar", "model-store/minilm.mar"} <= set(layout)
    assert (tmp_path / "bucket/model-store/minilm.mar").read_bytes() == b"archive minilm.mar"


# -- how the pieces fit ------------------------------------------------------------------------------------------


def test_every_probe_of_torchserve_is_the_images_health_check_and_readiness_asks_every_lane(containers):
    torchserve = containers["torchserve"]
    config = next(arg for arg in torchserve["args"] if arg.endswith("config.properties"))
    health = ["python", "-m", "scripts.container.healthcheck", "--config", config, "--key-file", "/keys/key_file.json"]
    # Liveness: TorchServe answers; readiness (and start-up): every lane has a READY worker. The check renews
    # an expired key through /token, so the probes outlive token_expiration_min.
    assert torchserve["livenessProbe"]["exec"]["command"] == health
    assert torchserve["readinessProbe"]["exec"]["command"] == [*health, "--ready"]
    assert torchserve["startupProbe"]["exec"]["command"] == [*health, "--ready"]
    assert torchserve["workingDir"] == "/keys"  # TorchServe writes key_file.json into its working directory


def test_the_gateway_forwards_to_torchserve_within_its_request_limit_and_takes_the_token_from_the_secret(
    containers, deployment, pod_config
):
    nginx = (K8S / "gateway" / "nginx.conf").read_text()
    port = pod_config.get("inference_address", "").rsplit(":", 1)[1]
    assert f"server 127.0.0.1:{port};" in nginx
    env = {variable["name"]: variable for variable in containers["gateway"]["env"]}
    assert env["CLIENT_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "unified-serve-client-token", "key": "token"}
    assert env["TORCHSERVE_KEY_FILE"]["value"] == "/keys/key_file.json"
    gateway_port = containers["gateway"]["ports"][0]
    assert f"listen {gateway_port['containerPort']} reuseport;" in nginx
    service = one(K8S / "service.yaml")
    assert service["spec"]["ports"][0]["targetPort"] == gateway_port["name"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_gateway_is_the_front_door_rendered_for_the_pod():
    """One renderer for make serve's front door and the pod's gateway: the committed file is its output."""
    assert GATEWAY_CONF.read_text() == gateway_conf(ServerConfig.read()), "run `python -m scripts.deploy.render k8s`"


def test_the_gateway_cuts_each_route_at_its_lanes_byte_limit(pod_config):
    """One place for the numbers: the archives' handler.max_request_bytes (else max_request_size); the gateway
    repeats them per route."""
    nginx = GATEWAY_CONF.read_text()
    routes = dict(re.findall(r"location ~ \^/predictions/([\w-]+)\(/\[\^/\]\*\)\?\$ \{[^}]*?client_max_body_size (\d+);", nginx))
    assert sorted(routes) == sorted(pod_config.loaded_lanes())
    for lane, archive in pod_config.loaded_lanes().items():
        settings = HandlerSettings.from_yaml(
            yaml.safe_load((ROOT / "models" / archive.removesuffix(".mar") / "model-config.yaml").read_text()), lane
        )
        assert int(routes[lane]) == (settings.bytes_for(lane) or pod_config.max_request_size)
    assert int(routes["digits-bulk"]) == pod_config.max_request_size


def test_the_pod_runs_as_non_root_on_one_gpu_with_the_model_store_read_only(deployment, containers):
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    for container in containers.values():
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
        assert context["capabilities"]["drop"] == ["ALL"]
    assert containers["torchserve"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["model-store"]["persistentVolumeClaim"] == {"claimName": "model-store", "readOnly": True}
    assert volumes["keys"]["emptyDir"]["medium"] == "Memory"
    assert volumes["config"]["configMap"]["name"] == "torchserve-config"
    assert volumes["gateway"]["configMap"]["name"] == "gateway"
    assert one(K8S / "pvc.yaml")["metadata"]["name"] == "model-store"
    assert "replicas" not in deployment["spec"]  # the HPA owns it


def test_the_hpa_scales_the_deployment_on_the_metric_prometheus_adapter_serves(deployment, tmp_path):
    hpa = one(K8S / "autoscaling" / "hpa.yaml")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    rules = yaml.safe_load(one(K8S / "prometheus-adapter.yaml")["data"]["config.yaml"])["rules"]
    (rule,) = [rule for rule in rules if rule["name"]["as"] == metric["pods"]["metric"]["name"]]
    assert re.match(rule["name"]["matches"], rule["seriesQuery"].split("{")[0])
    # The query as the adapter expands it for one pod: valid PromQL (promtool) over series TorchServe exports.
    query = rule["metricsQuery"].replace("<<.LabelMatchers>>", 'namespace="serving",pod="unified-serve-0"')
    query = query.replace("<<.GroupBy>>", "pod")
    assert metric_names(query) <= declared_series()
    rules_file = tmp_path / "adapter.rules.yml"
    rules_file.write_text(
        yaml.safe_dump({"groups": [{"name": "adapter", "rules": [{"record": "adapter:check", "expr": query}]}]})
    )
    result = subprocess.run(
        [str(binary("promtool")), "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_inference_service_runs_the_pods_containers_as_a_custom_predictor(deployment, containers, inference_service):
    annotations = inference_service["metadata"]["annotations"]
    assert annotations["serving.kserve.io/deploymentMode"] == "RawDeployment"
    assert annotations["serving.kserve.io/autoscalerClass"] == "external"  # the HPA from deploy/k8s/autoscaling
    predictor = inference_service["spec"]["predictor"]
    pod = deployment["spec"]["template"]["spec"]
    assert "model" not in predictor  # not KServe's TorchServe runtime
    for field in ("securityContext", "tolerations", "terminationGracePeriodSeconds", "automountServiceAccountToken"):
        assert predictor[field] == pod[field], field
    # KServe copies STORAGE_URI to /mnt/models in kserve-container; its Service sends traffic to the port of the
    # collocated transformer-container, here the gateway, the one container with a port.
    served = {container["name"]: container for container in predictor["containers"]}
    assert list(served) == ["kserve-container", "transformer-container"]
    assert served["transformer-container"] == {**containers["gateway"], "name": "transformer-container"}
    torchserve = copy.deepcopy(served["kserve-container"])
    del torchserve["name"]
    env = {variable["name"]: variable["value"] for variable in torchserve.pop("env")}
    assert re.match(r"(s3|gs)://[^/]+/.+", env.pop("STORAGE_URI"))
    assert env == {variable["name"]: variable["value"] for variable in containers["torchserve"]["env"]}
    (image,) = kustomization()["images"]
    assert torchserve.pop("image") == f"{image['newName']}:{image['newTag']}"
    expected = {key: value for key, value in containers["torchserve"].items() if key not in ("name", "image", "env")}
    # The config and the archives come from the bucket (/mnt/models), not from a ConfigMap and a volume.
    expected["volumeMounts"] = [mount for mount in expected["volumeMounts"] if mount["name"] not in ("config", "model-store")]
    expected.pop("ports")  # metrics: scraped through the prometheus.io annotations; only the gateway has a port
    assert json.loads(json.dumps(torchserve)) == json.loads(
        json.dumps(expected).replace("/home/model-server/config/config.properties", "/mnt/models/config/config.properties")
    )
    volumes = [volume for volume in pod["volumes"] if volume["name"] not in ("config", "model-store")]
    assert predictor["volumes"] == volumes
    assert str(torchserve["resources"]["limits"]["nvidia.com/gpu"]) == "1"


# -- memory: one derivation (scripts/deploy/memory.py), the manifest, the JVM's flags and the gateway checked against it


def test_the_pods_memory_is_the_derivation_from_the_lanes_numbers(containers, pod_config):
    pod = derive(pod_config)
    assert [lane.lane for lane in pod.lanes] == list(pod_config.loaded_lanes()) == list(WORKER_PEAK_MIB)
    resources = containers["torchserve"]["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == f"{pod.torchserve_mib}Mi", (
        "set deployment.yaml's torchserve memory to what `python -m scripts.deploy.memory` derives"
    )
    needed = pod.workers_mib + pod.heap_mib + pod.direct_mib + JVM_NATIVE_MIB
    assert needed <= pod.torchserve_mib < needed + 256
    # Stream lanes: bodies at the archive's byte limit, job_queue_size queued beside the workers' batches.
    digits = next(lane for lane in pod.lanes if lane.lane == "digits")
    stream = pod_config.lane_settings("digits")["digits"]
    assert digits.body_bytes == 2 * 1024 * 1024
    assert digits.held_bodies == pod_config.job_queue_size + stream.workers * stream.batch_size
    assert digits.workers_mib == stream.workers * WORKER_PEAK_MIB["digits"]
    assert pod.heap_mib >= FRONTEND_HEAP_BASE_MIB + sum(lane.bodies_mib for lane in pod.lanes)


def test_the_frontends_heap_and_direct_memory_are_bounded_as_derived(pod_config):
    pod = derive(pod_config)
    expected = {"heap": pod.heap_mib, "direct": pod.direct_mib}
    assert jvm_flags(pod_config.get("vmargs", "")) == expected
    assert jvm_flags(ServerConfig.read().get("vmargs", "")) == expected  # make serve and the tests' servers too
    assert pod_config.job_queue_size == ServerConfig.read().job_queue_size == 100


def test_the_gateway_lets_onto_each_bulk_lane_what_the_derivation_counts(pod_config):
    limits = gateway_limits(GATEWAY_CONF.read_text())
    bulk = [lane for lane in pod_config.loaded_lanes() if lane.endswith("-bulk")]
    assert limits == {lane: bulk_admitted(pod_config, lane) for lane in bulk}
    settings = pod_config.lane_settings("digits")["digits-bulk"]
    assert limits["digits-bulk"] >= settings.workers * settings.batch_size  # a full batch still gets in


def test_the_kubernetes_guide_shows_the_sum(pod_config):
    pod = derive(pod_config)
    guide = (ROOT / "docs" / "kubernetes.md").read_text()
    region = guide.split(memory.GUIDE_BEGIN)[1].split(memory.GUIDE_END)[0]
    assert region == f"\n```\n{summary(pod)}\n```\n", "docs/kubernetes.md's sum is stale: run `make archive`"
    assert f"-> {pod.torchserve_mib} MiB" in region and f"heap {pod.heap_mib} (-Xmx)" in region


def test_the_derived_memory_is_written_where_it_is_used(tmp_path, pod_config):
    pod = derive(pod_config)
    stale = {}
    for name, source, old, new in [
        ("config.properties", CONFIG, f"-Xmx{pod.heap_mib}m", "-Xmx1m"),
        ("deployment.yaml", K8S / "deployment.yaml", f"memory: {pod.torchserve_mib}Mi", "memory: 1Mi"),
        ("kubernetes.md", ROOT / "docs" / "kubernetes.md", f"-> {pod.torchserve_mib} MiB", "-> 1 MiB"),
        ("inferenceservice.yaml", KSERVE / "inferenceservice.yaml", f"memory: {pod.torchserve_mib}Mi", "memory: 1Mi"),
    ]:
        stale[name] = tmp_path / name
        stale[name].write_text(source.read_text().replace(old, new))
    files = [stale[name] for name in ("config.properties", "deployment.yaml", "kubernetes.md", "inferenceservice.yaml")]
    assert "memory: 1Mi" in stale["inferenceservice.yaml"].read_text()
    changed = memory.rewrite(pod, *files)
    assert sorted(path.name for path in changed) == sorted(stale)
    assert stale["config.properties"].read_text() == CONFIG.read_text()
    assert stale["deployment.yaml"].read_text() == (K8S / "deployment.yaml").read_text()
    assert stale["kubernetes.md"].read_text() == (ROOT / "docs" / "kubernetes.md").read_text()
    assert stale["inferenceservice.yaml"].read_text() == (KSERVE / "inferenceservice.yaml").read_text()
    assert memory.rewrite(pod, *files) == []


def test_the_pod_runs_both_lanes_with_cpu_requested_not_limited_and_the_bulk_lanes_in_the_background(
    deployment, containers, pod_config
):
    lanes = pod_config.lanes()
    bulk = [lane for lane in lanes if lane.endswith("-bulk")]
    assert bulk and all(lane.removesuffix("-bulk") in lanes for lane in bulk)  # each bulk lane beside its stream lane
    torchserve = containers["torchserve"]
    assert "cpu" in torchserve["resources"]["requests"]
    assert "cpu" not in torchserve["resources"]["limits"]  # no CFS quota throttling the stream lanes
    env = {item["name"]: item.get("value") for item in torchserve["env"]}
    assert (env["OMP_WAIT_POLICY"], env["GOMP_SPINCOUNT"]) == (PASSIVE, SPIN_GRACE)  # as make serve's workers
    # SCHED_IDLE needs no capability: nothing added back, seccomp's default profile allows sched_setscheduler.
    assert "add" not in torchserve["securityContext"]["capabilities"]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    mounts = {mount["name"]: mount["mountPath"] for mount in torchserve["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in deployment["spec"]["template"]["spec"]["volumes"]}
    assert mounts["shm"] == "/dev/shm" and volumes["shm"]["emptyDir"]["medium"] == "Memory"
    for lane in bulk:
        model = lane.removesuffix("-bulk")
        config = yaml.safe_load((ROOT / "models" / model / "model-config.yaml").read_text())
        settings = HandlerSettings.from_yaml(config, lane)
        assert settings.priority_for(lane) == "background"
        assert settings.priority_for(model) == "interactive"
