"""The deployment manifests under deploy/, read and validated offline, as `kubectl apply --validate=strict` would.

- Core kinds (Deployment, Service, HorizontalPodAutoscaler, ...): kubernetes-validate's strict schemas of a
  pinned Kubernetes version; a kind it has no schema for is refused, never skipped.
- InferenceService: KServe's own CRD schema (deploy/kserve/schema/, see its README), made strict the way the
  API server's field validation is: an object that lists its properties takes no others, unless the CRD
  says x-kubernetes-preserve-unknown-fields. Its metadata is checked as Kubernetes' ObjectMeta.

    python -m scripts.deploy.manifests deploy/k8s/deployment.yaml deploy/kserve/inferenceservice.yaml
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

from scripts import cli
from scripts.errors import ScriptError
from scripts.layout import ROOT

# KServe v0.20.0 builds against k8s.io/api 0.34 (its go.mod), so both kinds of manifest are checked for 1.34.
KUBERNETES_VERSION = "1.34.0"
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
KSERVE = DEPLOY / "kserve"
KSERVE_SCHEMA = KSERVE / "schema" / "inferenceservice-v1beta1.json"
INFERENCE_SERVICE = ("serving.kserve.io/v1beta1", "InferenceService")
OBJECT_META = "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


class ManifestError(ScriptError):
    """A manifest that the cluster would refuse: names the object, the field and what was wrong."""


def load_documents(path: Path) -> list[dict]:
    """Every YAML document of a manifest file (empty ones skipped)."""
    try:
        return [document for document in yaml.safe_load_all(path.read_text()) if document]
    except yaml.YAMLError as error:
        raise ManifestError(f"{path} is not valid YAML: {error}") from None


def validate(document: dict, version: str = KUBERNETES_VERSION) -> None:
    """Raise ManifestError unless `document` is valid for its kind (an InferenceService or a core kind)."""
    if (document.get("apiVersion"), document.get("kind")) == INFERENCE_SERVICE:
        validate_inference_service(document, version)
    else:
        validate_core(document, version)


def validate_core(document: dict, version: str = KUBERNETES_VERSION) -> None:
    try:
        kubernetes_validate.validate(document, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        raise ManifestError(_message(document, error)) from None
    except kubernetes_validate.SchemaNotFoundError as error:
        raise ManifestError(f"{_name(document)}: {error.message}") from None


def validate_inference_service(document: dict, version: str = KUBERNETES_VERSION) -> None:
    error = jsonschema.exceptions.best_match(_inference_service_validator(version).iter_errors(document))
    if error is not None:
        raise ManifestError(_message(document, error))


def strict(schema: Any) -> Any:
    """A copy of an OpenAPI schema in which every object with listed properties refuses unlisted ones."""
    schema = copy.deepcopy(schema)
    _close(schema)
    return schema


def _close(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _close(item)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key == "properties":
            for child in value.values():
                _close(child)
        elif isinstance(value, dict | list):
            _close(value)
    open_ended = node.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in node
    if "properties" in node and not open_ended:
        node["additionalProperties"] = False


@lru_cache(maxsize=2)
def _inference_service_validator(version: str) -> jsonschema.protocols.Validator:
    if not KSERVE_SCHEMA.is_file():
        raise ManifestError(f"{KSERVE_SCHEMA} is missing: see deploy/kserve/schema/README.md to extract it")
    schema = strict(json.loads(KSERVE_SCHEMA.read_text()))
    # The CRD leaves metadata open (the API server checks it as ObjectMeta): check it the same way.
    schema["properties"]["metadata"] = {"$ref": OBJECT_META}
    major_minor = ".".join(version.split(".")[:2])
    definitions = schema_contents(f"kubernetes-json-schema/v{major_minor}.0-local-strict/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ Registry()
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _name(document: dict) -> str:
    name = (document.get("metadata") or {}).get("name", "<no name>")
    return f"{document.get('kind', '<no kind>')}/{name}"


def _message(document: dict, error: jsonschema.ValidationError) -> str:
    where = ".".join(str(part) for part in error.absolute_path) or "(top level)"
    return f"{_name(document)}: {where}: {error.message}"


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("files", nargs="+", type=Path, help="manifest files (YAML, several documents each allowed)")
    parser.add_argument("--kubernetes-version", default=KUBERNETES_VERSION)
    args = parser.parse_args()
    for path in args.files:
        for document in load_documents(path):
            validate(document, args.kubernetes_version)
            print(f"{path}: {_name(document)} valid for Kubernetes {args.kubernetes_version}")
    return 0


if __name__ == "__main__":
    cli.run(main)
