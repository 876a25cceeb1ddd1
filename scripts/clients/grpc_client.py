"""gRPC client for TorchServe's inference API: unary Predictions and streams of single requests.

    python -m scripts.clients.grpc_client --model digits tests/fixtures/digit_7.png
    python -m scripts.clients.grpc_client --model digits --repeat 100 tests/fixtures/digit_7.png   # one stream
    python -m scripts.clients.grpc_client --model digits-seq --stream2 --repeat 100 tests/fixtures/digit_7.png

The inference token travels in the call metadata ("authorization: Bearer <key>"), read per call; a call
refused for its token (expired or rotated meanwhile) is sent once more with a fresh one. A request the handler
refuses comes back over gRPC as a normal reply whose body is the REST error JSON (TorchServe's gRPC path
drops the per-request status that REST turns into a 4xx), so this client recognises that body and raises
PredictionError with its message, as REST clients get a 4xx.

Streams: `stream()` keeps one channel (one HTTP/2 connection) open and pipelines unary Predictions calls
on it, answers in request order. `stream2()` uses the bidirectional StreamPredictions2 RPC, which
TorchServe 0.12 serves only for stateful (sequence-batching) models: the `<model>-seq` lane that
scripts/swap/sequence_lane.py registers, same weights and handler.
"""

from __future__ import annotations

import collections
import json
import threading
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from handlers.errors import RequestError
from scripts import cli
from scripts.clients.rest import add_lane_options, sample_body
from scripts.errors import ScriptError
from scripts.server.endpoints import REFUSED_MESSAGE, Endpoints

try:
    from scripts.clients.grpc_stubs import inference_pb2, inference_pb2_grpc
except ImportError as missing:  # generated at build time, never committed
    raise ImportError(f"gRPC stubs are missing ({missing}): run `make grpc-stubs`") from None

# The handler's error body ({"code", "type", "message"}): derived from the handler itself, so both agree.
ERROR_KEYS = frozenset(RequestError("").to_dict())
STATELESS_STREAM2 = (
    "TorchServe 0.12 answers StreamPredictions2 only for stateful models (sequence batching); for a "
    "stateless model like {model!r} it drops the stream. Stream to its sequence lane ({model}-seq, registered "
    "by `python -m scripts.swap.sequence_lane`) or use stream() (pipelined Predictions on one channel)"
)


@dataclass
class PredictionError(ScriptError):
    """One request failed: the handler's 4xx body, or a gRPC status from TorchServe itself."""

    message: str
    code: int | str
    type: str

    def __str__(self) -> str:
        return f"{self.type} ({self.code}): {self.message}"


def error_in(body: bytes) -> PredictionError | None:
    """The handler's error JSON, if `body` is one (results never have exactly these keys)."""
    if not body.lstrip().startswith(b"{"):
        return None
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if isinstance(parsed, dict) and set(parsed) == ERROR_KEYS and isinstance(parsed["code"], int) and parsed["code"] >= 400:
        return PredictionError(parsed["message"], parsed["code"], parsed["type"])
    return None


def result_of(body: bytes) -> Any:
    """The decoded JSON result, or PredictionError when the handler refused the request."""
    error = error_in(body)
    if error is not None:
        raise error
    return json.loads(body)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def token_refused(error: grpc.RpcError) -> bool:
    """TorchServe's refusal of a missing, wrong or expired token (PERMISSION_DENIED, its REST message)."""
    return error.code() == grpc.StatusCode.PERMISSION_DENIED and REFUSED_MESSAGE in (error.details() or "")


def rpc_error(error: grpc.RpcError) -> PredictionError:
    details = (error.details() or "").splitlines()
    return PredictionError(details[0] if details else "no details from the server", error.code().name, "GrpcError")


class GrpcClient:
    """One channel to TorchServe's gRPC inference port; thread-safe like the grpc channel under it."""

    def __init__(self, endpoints: Endpoints, timeout: float = 60.0) -> None:
        self.endpoints = endpoints
        self.channel = grpc.insecure_channel(f"{endpoints.grpc_host}:{endpoints.grpc_inference_port}")
        self.stub = inference_pb2_grpc.InferenceAPIsServiceStub(self.channel)
        self.endpoints.token("inference")  # fail now, with the hint, when the server wrote no key file
        self.timeout = timeout

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The inference token as call metadata, read per call: keys expire and rotate (scripts/server/endpoints.py)."""
        return bearer(self.endpoints.token("inference"))

    def _call(self, rpc, request):
        """A unary call; once more with a fresh token when TorchServe refused the first one's token."""

        def send(token: str):
            try:
                return rpc(request, metadata=bearer(token), timeout=self.timeout)
            except grpc.RpcError as error:
                return error

        reply = self.endpoints.with_token("inference", send, lambda r: isinstance(r, grpc.RpcError) and token_refused(r))
        if isinstance(reply, grpc.RpcError):
            raise reply
        return reply

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> GrpcClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, model: str, body: bytes, version: str | None = None) -> inference_pb2.PredictionsRequest:
        # The handler reads the "body" parameter exactly as a REST body (raw item or JSON instances).
        return inference_pb2.PredictionsRequest(model_name=model, model_version=version or "", input={"body": body})

    def predict(self, model: str, body: bytes, version: str | None = None) -> Any:
        """One unary Predictions call: the decoded result, or PredictionError."""
        try:
            reply = self._call(self.stub.Predictions, self.request(model, body, version))
        except grpc.RpcError as error:
            raise rpc_error(error) from None
        return result_of(reply.prediction)

    def stream(self, model: str, bodies: Iterable[bytes], window: int = 8, version: str | None = None) -> Iterator[Any]:
        """Results for `bodies` in order, with up to `window` calls in flight on this one channel.

        Each item is its own Predictions call, so TorchServe's dynamic batcher can merge items from
        many streams; a refused item raises PredictionError when its turn comes.
        """
        pending: collections.deque = collections.deque()
        for body in bodies:
            request = self.request(model, body, version)
            pending.append((request, self.stub.Predictions.future(request, metadata=self.metadata, timeout=self.timeout)))
            if len(pending) >= window:
                yield self._settle(*pending.popleft())
        while pending:
            yield self._settle(*pending.popleft())

    def _settle(self, request, future) -> Any:
        try:
            try:
                reply = future.result()
            except grpc.RpcError as error:
                if not token_refused(error):
                    raise
                # The key expired or was rotated while the call was in flight: this one again, unary.
                reply = self._call(self.stub.Predictions, request)
            return result_of(reply.prediction)
        except grpc.RpcError as error:
            raise rpc_error(error) from None

    def stream2(
        self, model: str, bodies: Iterable[bytes], window: int = 8, version: str | None = None, timeout: float | None = None
    ) -> SequenceStream:
        """StreamPredictions2 to a stateful lane (e.g. digits-seq): one long-lived call, one answer per body, in order.

        The stream is one TorchServe sequence (a fresh sequence_id); up to `window` bodies are in flight
        (keep it below the lane's maxSequenceJobQueueSize). `bodies` may be a generator that produces
        items over time. `timeout` bounds the whole call (default: none, the stream lives as long as
        `bodies`). See SequenceStream for how errors arrive.
        """
        sequence_id = f"grpc-client-{uuid.uuid4()}"
        messages = (
            inference_pb2.PredictionsRequest(
                model_name=model, model_version=version or "", input={"body": body}, sequence_id=sequence_id
            )
            for body in bodies
        )
        return SequenceStream(self.stub.StreamPredictions2, messages, model, window, self.metadata, timeout)


class SequenceStream:
    """Iterator over one StreamPredictions2 call's answers, in request order.

    next() returns an item's decoded result, or raises PredictionError for an item the handler refused;
    the stream goes on, so the next call to next() answers the following item. Errors of the call
    itself (bad token, unknown model, a stateless model: StreamNotSupported) raise and end the stream.
    """

    def __init__(self, rpc, messages: Iterator, model: str, window: int, metadata, timeout: float | None) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.model = model
        self.window = window
        self._slots = threading.Semaphore(window)
        self._closed = threading.Event()
        self._call = rpc(self._requests(messages), metadata=metadata, timeout=timeout)

    def _requests(self, messages: Iterator) -> Iterator:
        # Runs on gRPC's sending thread. TorchServe ends the call as soon as the client half-closes and
        # drops the answers still in flight, so after the last message the request side stays open
        # until every answer has arrived (all `window` slots are back).
        for message in messages:
            if not self._take_slot():
                return
            yield message
        for _ in range(self.window):
            if not self._take_slot():
                return

    def _take_slot(self) -> bool:
        # Also gives up when the call ended without close() (an abandoned stream whose channel was closed).
        while not self._closed.is_set() and not (hasattr(self, "_call") and self._call.done()):
            if self._slots.acquire(timeout=0.2):
                return True
        return False

    def __iter__(self) -> SequenceStream:
        return self

    def __next__(self) -> Any:
        try:
            reply = next(self._call)
        except StopIteration:
            self.close()
            raise
        except grpc.RpcError as error:
            self.close()
            if error.code() == grpc.StatusCode.UNKNOWN and not error.details():
                raise PredictionError(STATELESS_STREAM2.format(model=self.model), "UNKNOWN", "StreamNotSupported") from None
            raise rpc_error(error) from None
        self._slots.release()
        if reply.HasField("status") and reply.status.code != 0:
            # TorchServe's own refusal (e.g. unknown model); it ends the call right after.
            self.close()
            raise PredictionError(reply.status.message, reply.status.code, "GrpcError")
        return result_of(reply.prediction)

    def close(self) -> None:
        """Stop sending and cancel the call (also safe after it ended)."""
        self._closed.set()
        self._call.cancel()

    def __enter__(self) -> SequenceStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("file", nargs="?", type=Path, help='an image or a .json {"instances": [...]} file')
    add_lane_options(parser)
    parser.add_argument("--version", help="a model version (default: the lane's default version)")
    parser.add_argument("--repeat", type=int, default=1, help="send the file this many times on one stream")
    parser.add_argument(
        "--stream2", action="store_true", help="stream with StreamPredictions2 (needs a stateful lane, e.g. <model>-seq)"
    )
    cli.add_server_options(parser)
    args = parser.parse_args(argv)
    if args.file is not None and not args.file.exists():
        parser.error(f"{args.file} does not exist")
    endpoints = Endpoints.from_config(args.config, args.key_file)
    body = args.file.read_bytes() if args.file is not None else sample_body(args.model, args.sample)
    with GrpcClient(endpoints) as client:
        if args.stream2:
            results = list(client.stream2(args.model, [body] * args.repeat, version=args.version))
        elif args.repeat == 1:
            results = [client.predict(args.model, body, args.version)]
        else:
            results = list(client.stream(args.model, [body] * args.repeat, version=args.version))
    print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
