"""gRPC client for TorchServe's inference API: unary Predictions and streams of single requests.

    python -m scripts.grpc_client --model digits tests/fixtures/digit_7.png
    python -m scripts.grpc_client --model digits --repeat 100 tests/fixtures/digit_7.png   # one stream

The inference token travels in the call metadata ("authorization: Bearer <key>"). A request the handler
refuses comes back over gRPC as a normal reply whose body is the REST error JSON (TorchServe's gRPC path
drops the per-request status that REST turns into a 4xx), so this client recognises that body and raises
PredictionError with its message, as REST clients get a 4xx.

Streams: `stream()` keeps one channel (one HTTP/2 connection) open and pipelines unary Predictions calls
on it, answers in request order. `stream2()` uses the bidirectional StreamPredictions2 RPC; TorchServe
0.12 serves that only for stateful (sequence-batching) models, see its docstring.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import grpc

from handlers.errors import RequestError
from scripts.endpoints import CONFIG, KEY_FILE, Endpoints

try:
    from scripts.grpc_stubs import inference_pb2, inference_pb2_grpc
except ImportError as missing:  # generated at build time, never committed
    raise SystemExit(f"gRPC stubs are missing ({missing}): run `make grpc-stubs`") from None

# The handler's error body ({"code", "type", "message"}): derived from the handler itself, so both agree.
ERROR_KEYS = frozenset(RequestError("").to_dict())
STATELESS_STREAM2 = (
    "TorchServe 0.12 answers StreamPredictions2 only for stateful models (sequence batching); for a "
    "stateless model like {model!r} it drops the stream. Use stream() (pipelined Predictions on one channel)"
)


@dataclass
class PredictionError(Exception):
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


def rpc_error(error: grpc.RpcError) -> PredictionError:
    details = (error.details() or "").splitlines()
    return PredictionError(details[0] if details else "no details from the server", error.code().name, "GrpcError")


class GrpcClient:
    """One channel to TorchServe's gRPC inference port; thread-safe like the grpc channel under it."""

    def __init__(self, endpoints: Endpoints, timeout: float = 60.0) -> None:
        self.channel = grpc.insecure_channel(f"{endpoints.grpc_host}:{endpoints.grpc_inference_port}")
        self.stub = inference_pb2_grpc.InferenceAPIsServiceStub(self.channel)
        self.metadata = (("authorization", f"Bearer {endpoints.token('inference')}"),)
        self.timeout = timeout

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "GrpcClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, model: str, body: bytes, version: str | None = None) -> inference_pb2.PredictionsRequest:
        # The handler reads the "body" parameter exactly as a REST body (raw item or JSON instances).
        return inference_pb2.PredictionsRequest(model_name=model, model_version=version or "", input={"body": body})

    def predict(self, model: str, body: bytes, version: str | None = None) -> Any:
        """One unary Predictions call: the decoded result, or PredictionError."""
        try:
            reply = self.stub.Predictions(self.request(model, body, version), metadata=self.metadata, timeout=self.timeout)
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
            pending.append(self.stub.Predictions.future(self.request(model, body, version), metadata=self.metadata, timeout=self.timeout))
            if len(pending) >= window:
                yield self._settle(pending.popleft())
        while pending:
            yield self._settle(pending.popleft())

    def _settle(self, future) -> Any:
        try:
            return result_of(future.result().prediction)
        except grpc.RpcError as error:
            raise rpc_error(error) from None

    def stream2(self, model: str, bodies: Iterable[bytes], version: str | None = None) -> Iterator[Any]:
        """StreamPredictions2: one bidirectional stream, one reply per request, in order.

        TorchServe 0.12 requires a sequence_id on every message and then looks the sequence up in the
        model's job groups, which exist only for stateful (sequence-batching) models; for any other model
        the server throws and ends the call with UNKNOWN, which is raised here as PredictionError.
        """
        sequence = f"grpc-client-{uuid.uuid4()}"
        requests = (
            inference_pb2.PredictionsRequest(model_name=model, model_version=version or "", input={"body": body}, sequence_id=sequence)
            for body in bodies
        )
        try:
            for reply in self.stub.StreamPredictions2(requests, metadata=self.metadata, timeout=self.timeout):
                if reply.HasField("status") and reply.status.code != 0:
                    raise PredictionError(reply.status.message, reply.status.code, "GrpcError")
                yield result_of(reply.prediction)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.UNKNOWN and not error.details():
                raise PredictionError(STATELESS_STREAM2.format(model=model), "UNKNOWN", "StreamNotSupported") from None
            raise rpc_error(error) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path, help="an image or a .json {\"instances\": [...]} file")
    parser.add_argument("--model", default="digits", help="lane: digits, digits-bulk, ...")
    parser.add_argument("--version", help="a model version (default: the lane's default version)")
    parser.add_argument("--repeat", type=int, default=1, help="send the file this many times on one stream")
    parser.add_argument("--config", type=Path, default=CONFIG, help="config.properties to read the gRPC port from")
    parser.add_argument("--key-file", type=Path, default=KEY_FILE, help="TorchServe's key_file.json")
    args = parser.parse_args(argv)
    if not args.file.exists():
        parser.error(f"{args.file} does not exist")
    endpoints = Endpoints.from_config(args.config, args.key_file)
    body = args.file.read_bytes()
    try:
        with GrpcClient(endpoints) as client:
            if args.repeat == 1:
                results = [client.predict(args.model, body, args.version)]
            else:
                results = list(client.stream(args.model, [body] * args.repeat, version=args.version))
    except PredictionError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
