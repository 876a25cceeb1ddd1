"""TorchServe's REST management API as the hot-swap needs it, with errors that say what to do.

Every call carries the management token (renewed and sent again once when it expired or was rotated
meanwhile); a refused token, an unknown model or version, a version that already exists and an archive
whose recorded sha256 does not match become errors with a message for the user, not a stack trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import requests

from scripts.archive.reader import MarFile
from scripts.errors import ScriptError
from scripts.server.config import LaneSettings
from scripts.server.endpoints import Endpoints, token_refused


class ManagementError(ScriptError):
    """A management call that TorchServe refused; the message is meant for the user."""


@dataclass(frozen=True)
class VersionState:
    """One registered version of a lane, as describe-model reports it."""

    version: str
    url: str
    default: bool
    ready_workers: int
    workers: int
    pending_requests: int
    response_timeout: int
    worker_pids: tuple[int, ...] = ()


class ManagementApi:
    def __init__(self, endpoints: Endpoints, timeout: float = 60.0) -> None:
        self.endpoints = endpoints
        self.timeout = timeout

    def versions(self, model: str) -> list[VersionState]:
        """All registered versions of `model`; ManagementError if the model is not registered."""
        reply = self._call("GET", f"/models/{model}/all", subject=f"model {model!r}")
        default = self._default_version(model)
        return [_version_state(entry, default) for entry in reply.json()]

    def worker_pids(self, model: str) -> tuple[int, ...]:
        """The pids of the workers serving `model`, over all its registered versions, sorted."""
        return tuple(sorted(pid for state in self.versions(model) for pid in state.worker_pids))

    def version(self, model: str, version: str) -> VersionState:
        reply = self._call("GET", f"/models/{model}/{version}", subject=f"version {version} of {model!r}")
        return _version_state(reply.json()[0], self._default_version(model))

    def register(self, model: str, archive: Path, lane: LaneSettings) -> None:
        """Register `archive` (a file in the server's model store) under `model` and wait until its workers
        loaded; an archive whose sha256 `make archive` did not record, or that changed since, is refused."""
        MarFile(archive).verify_digest()
        url = archive.name
        params = {
            "url": url,
            "model_name": model,
            "batch_size": lane.batch_size,
            "max_batch_delay": lane.max_batch_delay,
            "response_timeout": lane.response_timeout,
            "initial_workers": lane.workers,
            "synchronous": "true",
        }
        self._call("POST", "/models", params=params, subject=f"archive {url} as {model!r}", timeout=max(self.timeout, 300))

    def set_default(self, model: str, version: str) -> None:
        self._call("PUT", f"/models/{model}/{version}/set-default", subject=f"version {version} of {model!r}")

    def unregister(self, model: str, version: str) -> None:
        self._call(
            "DELETE", f"/models/{model}/{version}", subject=f"version {version} of {model!r}", timeout=max(self.timeout, 120)
        )

    def _default_version(self, model: str) -> str:
        # /models/<name> describes only the default version: the one unversioned requests go to.
        return self._call("GET", f"/models/{model}", subject=f"model {model!r}").json()[0]["modelVersion"]

    def _call(
        self, method: str, path: str, subject: str, params: dict | None = None, timeout: float | None = None
    ) -> requests.Response:
        url = f"{self.endpoints.management}{path}"

        def send(token: str) -> requests.Response:
            headers = {"Authorization": f"Bearer {token}"}
            return requests.request(method, url, params=params, headers=headers, timeout=timeout or self.timeout)

        try:
            reply = self.endpoints.with_token("management", send, token_refused)
        except requests.ConnectionError:
            raise ManagementError(
                f"no TorchServe management API at {self.endpoints.management}: start it with `make serve`"
            ) from None
        if reply.status_code < 300:
            return reply
        raise ManagementError(self._explain(reply, subject))

    def _explain(self, reply: requests.Response, subject: str) -> str:
        try:
            body = reply.json()
            kind, message = body.get("type", ""), body.get("message", reply.text)
        except ValueError:
            kind, message = "", reply.text.strip()
        if kind == "InvalidKeyException" or reply.status_code in (401, 403):
            return (
                f"TorchServe refused the management token from {self.endpoints.key_file}"
                f": it is stale or wrong (restarts write new keys); {message}"
            )
        if reply.status_code == 404:
            return f"{subject} is not registered: {message}"
        if reply.status_code == 409:
            return f"{subject} is already registered: {message}"
        return f"{subject}: HTTP {reply.status_code} {kind}: {message}"


def _version_state(entry: dict, default: str) -> VersionState:
    workers = entry.get("workers", [])
    return VersionState(
        version=entry["modelVersion"],
        url=entry["modelUrl"],
        default=entry["modelVersion"] == default,
        ready_workers=sum(worker.get("status") == "READY" for worker in workers),
        workers=len(workers),
        pending_requests=entry.get("jobQueueStatus", {}).get("pendingRequests", 0),
        response_timeout=int(entry.get("responseTimeout", 120)),
        worker_pids=tuple(int(worker["pid"]) for worker in workers if worker.get("pid")),
    )
