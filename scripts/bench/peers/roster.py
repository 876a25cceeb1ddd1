"""Every peer of the field, in the report's order, and one by its sweep key."""

from __future__ import annotations

from scripts.bench.peers import bentoml_app, flask_app, litserve_app, pytriton_app, ray_serve_app
from scripts.bench.peers.field import Peer


def peers() -> list[Peer]:
    """Every peer, in the report's order: the per-request baseline first, then the batching systems."""
    return [module.PEER for module in (flask_app, litserve_app, ray_serve_app, bentoml_app, pytriton_app)]


def peer(key: str) -> Peer:
    found = {p.key: p for p in peers()}
    if key not in found:
        raise KeyError(f"no peer {key!r}: known {', '.join(found)}")
    return found[key]
