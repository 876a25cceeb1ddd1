"""Where a batch job's chunks go: the `<model>-bulk` lane of a server, or the same core in this process.

Both runners take a list of instances and give back a Reply (status + JSON body) shaped exactly like
the server's answer to `{"instances": [...]}`, so retries and bad-row isolation are written once
(scripts/jobs/chunks.py) and the in-process path runs the very code the handler runs.
"""

from __future__ import annotations

import io
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import requests

from handlers.core import InferenceCore
from handlers.decoding import NPY_KINDS, NPY_MEDIA, Payload
from scripts.clients.rest import predict, unavailable_reason
from scripts.errors import ConfigError, ScriptError
from scripts.server.config import BULK_SUFFIX, DEFAULT_JOB_QUEUE_SIZE, ServerConfig
from scripts.server.endpoints import Endpoints, token_refused


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any


# Chunks are JSON, sent under a JSON media type that TorchServe does not parse itself: its worker would
# decode application/json with Python's json (17 ms for 2,000 digits rows here), while any other type
# reaches the handler as bytes, which it parses with orjson (3.7 ms). Same body, same answer.
CHUNK_TYPE = "application/vnd.instances+json"
# Seconds a client waits past a lane's responseTimeout, for TorchServe's own answer (500 "Worker died.") to arrive.
ANSWER_MARGIN_S = 10


class TransientError(Exception):
    """The chunk did not get an answer (connection refused or reset, a server restarting, timeout): worth another try."""


class JobError(ScriptError):
    """Stops the whole job; the message says what to change. Committed rows stay resumable."""


class RowTooLarge(Exception):
    """One row alone is over the server's request size limit: that row fails, the job goes on."""


def encode_chunk(instances: list[Any], limit: int) -> tuple[bytes, str]:
    """The request body for a chunk and its media type, refused before sending when the server would reject its size.

    Rows of a columnar input (Parquet) are numpy rows: when every one is a row of numbers of one shape, the chunk goes
    as one .npy array (application/x-npy, handlers/decoding.py): no JSON written here nor parsed in the worker, no
    Python object per value. Anything else goes as JSON {"instances": [...]}. The handler decodes both alike and names
    a bad value the same way."""
    if _numeric_rows(instances):
        stream = io.BytesIO()
        np.save(stream, narrowest(np.stack(instances)), allow_pickle=False)
        body, media = stream.getvalue(), NPY_MEDIA
    else:
        body, media = orjson.dumps({"instances": instances}, option=orjson.OPT_SERIALIZE_NUMPY), CHUNK_TYPE
    if len(body) <= limit:
        return body, media
    if len(instances) == 1:
        raise RowTooLarge(
            f"the row encodes to {len(body)} bytes, over the server's max_request_size of {limit} bytes (config.properties)"
        )
    # Rows vary in size: leave a tenth of head room under the proportional estimate.
    fits = max(1, int(len(instances) * limit / len(body) * 0.9))
    raise JobError(
        f"a chunk of {len(instances)} rows encodes to {len(body)} bytes, over the server's max_request_size of "
        f"{limit} bytes (config.properties); use --chunk-size {fits} or smaller (--resume keeps the rows already done)"
    )


# Integer types from the narrowest up: a chunk of integers goes in the first that holds all its values.
NARROW_INTS = tuple(np.dtype(name) for name in ("uint8", "int8", "uint16", "int16", "uint32", "int32"))


def narrowest(array: np.ndarray) -> np.ndarray:
    """The same numbers in the narrowest type that holds every one exactly: integers in the smallest integer type
    (digits' 0..16 as uint8: 64 bytes a row instead of 512), float64 as float32 when no value changes. Less for the
    frontend to copy (3% more rows/s through digits-bulk, 200,000 rows, 4 rounds); the worker reads numbers, not
    types, so the answers are the same."""
    if array.size == 0:
        return array
    if array.dtype.kind in "iu":
        low, high = array.min(), array.max()
        for kind in NARROW_INTS:
            if kind.itemsize < array.dtype.itemsize and np.iinfo(kind).min <= low and high <= np.iinfo(kind).max:
                return array.astype(kind)
        return array
    if array.dtype == np.float64:
        single = array.astype(np.float32)
        if np.array_equal(single, array):  # exact for every value (a NaN never compares equal: kept as it is)
            return single
    return array


def _numeric_rows(instances: list[Any]) -> bool:
    first = instances[0] if instances else None
    if not isinstance(first, np.ndarray) or first.dtype.kind not in NPY_KINDS:
        return False
    return all(type(row) is np.ndarray and row.shape == first.shape and row.dtype == first.dtype for row in instances)


@dataclass
class ServerRunner:
    """POSTs chunks as {"instances": [...]} to a lane; one keep-alive session per worker thread."""

    endpoints: Endpoints
    lane: str
    size_limit: int
    timeout: float = 600.0
    job_queue_size: int = DEFAULT_JOB_QUEUE_SIZE
    _local: threading.local = field(default_factory=threading.local, init=False, repr=False, compare=False)
    # Seconds from sending each request to its answer, whatever the answer (list.append is atomic under the GIL, so
    # the job's threads share it): the bulk lane's p50/p99 a request in the bench (scripts/bench/bulk.py).
    latencies: list[float] = field(default_factory=list, init=False, repr=False, compare=False)

    @classmethod
    def for_lane(cls, endpoints: Endpoints, server: ServerConfig, lane: str, in_flight: int = 1) -> ServerRunner:
        """A runner for `lane` that waits for an answer as long as TorchServe may take to give one: the lane's
        responseTimeout in config.properties and a margin, once for each round of batches queued ahead of the last of
        `in_flight` requests (batchSize x workers a round), and never less than the default. A bulk lane's is a
        wall-clock backstop of hours (its own limit counts the time its worker ran, so a chunk the stream lanes starve
        answers late, not never); a client that gave up sooner would send the chunk again beside the one still
        queued or running."""
        timeout = cls.timeout
        try:
            settings = server.lane_settings(lane.removesuffix(BULK_SUFFIX)).get(lane)
        except ConfigError:
            settings = None  # a lane config.properties does not declare: the default
        if settings is not None:
            rounds = math.ceil(max(1, in_flight) / max(1, settings.batch_size * settings.workers))
            timeout = max(timeout, rounds * (settings.response_timeout + ANSWER_MARGIN_S))
        return cls(endpoints, lane, server.max_request_size, timeout=timeout, job_queue_size=server.job_queue_size)

    @property
    def name(self) -> str:
        return f"{self.lane} at {self.endpoints.inference}"

    def send(self, instances: list[Any]) -> Reply:
        try:
            body, media = encode_chunk(instances, self.size_limit)
        except RowTooLarge as error:
            return Reply(413, {"code": 413, "type": "RequestTooLarge", "message": str(error)})
        sent = time.perf_counter()
        try:
            reply = predict(self.endpoints, self.lane, body, media, timeout=self.timeout, session=self._session())
        except (requests.ConnectionError, requests.Timeout) as error:
            raise TransientError(f"no answer from {self.endpoints.prediction_url(self.lane)}: {error}") from None
        self.latencies.append(time.perf_counter() - sent)
        if token_refused(reply):  # even after a fresh key (predict renews): no row could pass, stop the job
            raise JobError(f"TorchServe refused the inference token from {self.endpoints.key_file}: {reply.json()['message']}")
        try:
            parsed = orjson.loads(reply.content)
        except orjson.JSONDecodeError:
            parsed = {"message": reply.text[:500]}
        reason = unavailable_reason(self.endpoints, self.lane, reply, self.job_queue_size)
        if reason is not None:  # TorchServe's own words would send the user looking for missing workers
            parsed = {"code": 503, "type": "ServiceUnavailable", "message": reason}
        return Reply(reply.status_code, parsed)

    def _session(self) -> requests.Session:
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session


class InProcessRunner:
    """The handler's InferenceCore in this process: the same decode, micro-batching and unbatch."""

    def __init__(self, core: InferenceCore, archive: Path) -> None:
        self.core = core
        self.archive = archive

    @property
    def name(self) -> str:
        return f"in-process {self.archive.name} on {self.core.device}"

    def send(self, instances: list[Any]) -> Reply:
        response = self.core.answer([Payload(items=instances, raw=False)])[0]
        return Reply(response.status, response.body)
