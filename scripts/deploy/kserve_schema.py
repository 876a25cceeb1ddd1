"""Extract the InferenceService's OpenAPI schema from KServe's CRD, for validating deploy/kserve/ offline.

    git -C <kserve clone> show v0.20.0:config/crd/full/serving.kserve.io_inferenceservices.yaml > crd.yaml
    python -m scripts.deploy.kserve_schema --crd crd.yaml --tag v0.20.0 --commit <the tag's commit>

Writes the CRD's openAPIV3Schema (version v1beta1) as JSON, unchanged, with a `$comment` naming its source.
The kserve SDK would carry the same models, but it pins older versions of packages this repository pins.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from scripts import cli
from scripts.deploy.manifests import KSERVE_SCHEMA
from scripts.errors import ConfigError

CRD_PATH = "config/crd/full/serving.kserve.io_inferenceservices.yaml"


def extract(crd: dict, version: str = "v1beta1") -> dict:
    """The openAPIV3Schema of `version` from a CustomResourceDefinition."""
    if crd.get("kind") != "CustomResourceDefinition":
        raise ConfigError(f"expected a CustomResourceDefinition, got kind {crd.get('kind')!r}")
    versions = {entry["name"]: entry for entry in crd["spec"]["versions"]}
    if version not in versions:
        raise ConfigError(f"the CRD has no version {version}; it has {', '.join(versions)}")
    return versions[version]["schema"]["openAPIV3Schema"]


def write(schema: dict, tag: str, commit: str, output: Path = KSERVE_SCHEMA) -> Path:
    source = f"openAPIV3Schema of InferenceService v1beta1 from github.com/kserve/kserve {tag} (commit {commit}), {CRD_PATH}"
    output.parent.mkdir(parents=True, exist_ok=True)
    # Compact and key-sorted: the same CRD always gives the same bytes (0.7 MB instead of 1.6 MB indented).
    body = {"$comment": source, **schema}
    output.write_text(json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n")
    return output


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--crd", type=Path, required=True, help=f"KServe's {CRD_PATH} at a release tag")
    parser.add_argument("--tag", required=True, help="the release tag it was taken from, e.g. v0.20.0")
    parser.add_argument("--commit", required=True, help="the commit the tag points at")
    parser.add_argument("--output", type=Path, default=KSERVE_SCHEMA)
    args = parser.parse_args()
    schema = extract(yaml.safe_load(args.crd.read_text()))
    print(f"wrote {write(schema, args.tag, args.commit, args.output)}")
    return 0


if __name__ == "__main__":
    cli.run(main)
