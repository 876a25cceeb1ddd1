"""The worker's buffered frame reader (handlers/torchserve/worker_protocol.py) against TorchServe's own reader: the same frames,
written in odd pieces, must come out equal, types included, message after message on one socket."""

from __future__ import annotations

import logging
import random
import socket
import struct
import sys
import threading
import types

import pytest
from ts.protocol import otf_message_handler as torchserve

from handlers.decoding import RequestLimits, UnreadValue, read_request
from handlers.errors import RequestError
from handlers.torchserve import worker_protocol
from handlers.torchserve.worker_protocol import CHECKED_RELEASE, FrameReader

END = struct.pack("!i", -1)


def _field(value: bytes) -> bytes:
    return struct.pack("!i", len(value)) + value


def load_frame(gpu: int) -> bytes:
    return (
        b"L"
        + _field(b"digits-bulk")
        + _field(b"/tmp/models/abc123")
        + struct.pack("!i", 32)
        + _field(b"torchserve_handler")
        + struct.pack("!i", gpu)
        + _field(b"")
        + struct.pack("!?", True)
    )


def request_frame(index: int, parameters: list[tuple[bytes, bytes, bytes]], headers: int = 4) -> bytes:
    frame = _field(f"request-{index:04d}-9f1c".encode())
    for header in range(headers):
        frame += _field(f"X-Header-{header}".encode()) + _field(f"value {index}.{header}".encode())
    frame += END
    for name, content_type, value in parameters:
        frame += _field(name) + _field(content_type) + _field(value)
    return frame + END


def inference_frame(requests: list[bytes]) -> bytes:
    return b"I" + b"".join(requests) + END


DIGIT = b'{"instances": [[0, 0, 5, 13, 9, 1, 0, 0]]}'
FRAMES = [
    load_frame(gpu=-1),
    inference_frame([request_frame(0, [(b"body", b"application/json", DIGIT)])]),
    inference_frame([request_frame(i, [(b"body", b"application/json", DIGIT)]) for i in range(32)]),
    inference_frame(
        [
            request_frame(0, [(b"data", b"text/plain", "naïve café".encode())]),
            request_frame(1, [(b"body", b"application/json", b"{not json")]),  # forwarded as bytes when decoding
            request_frame(2, [(b"file", b"image/png", bytes(range(256)) * 3)], headers=0),
            request_frame(3, [(b"a", b"", b""), (b"b", b"application/octet-stream", b"\x00\xff")]),
            request_frame(4, [], headers=1),
        ]
    ),
    load_frame(gpu=0),
    inference_frame([request_frame(0, [(b"body", b"application/json", b'{"texts": ["x"]}' + b" " * 200_000)])]),
]


def _write_in_pieces(sock: socket.socket, data: bytes, seed: int) -> threading.Thread:
    pieces = random.Random(seed)

    def write() -> None:
        at = 0
        while at < len(data):
            size = pieces.choice((1, 3, 7, 64, 4096, 70_000))
            sock.sendall(data[at : at + size])
            at += size

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def _read_all(read, data: bytes, count: int, seed: int = 7) -> list:
    ours, theirs = socket.socketpair()
    try:
        writer = _write_in_pieces(theirs, data, seed)
        messages = [read(ours) for _ in range(count)]
        writer.join(timeout=30)
        return messages
    finally:
        ours.close()
        theirs.close()


def _same(left, right) -> None:
    """Equal and of the same types all the way down (bytes == bytearray in Python, not for a handler's isinstance)."""
    assert type(left) is type(right), (left, right)
    if isinstance(left, dict):
        assert list(left) == list(right)
        for key in left:
            _same(left[key], right[key])
    elif isinstance(left, (list, tuple)):
        assert len(left) == len(right)
        for a, b in zip(left, right, strict=True):
            _same(a, b)
    else:
        assert left == right


@pytest.mark.parametrize("decode", [None, "true", "false"])
@pytest.mark.parametrize("buffer_bytes", [16, 1 << 16])
def test_frames_read_as_torchserve_reads_them(monkeypatch, decode, buffer_bytes):
    if decode is None:
        monkeypatch.delenv("TS_DECODE_INPUT_REQUEST", raising=False)
    else:
        monkeypatch.setenv("TS_DECODE_INPUT_REQUEST", decode)
    stream = b"".join(FRAMES)
    expected = _read_all(torchserve.retrieve_msg, stream, len(FRAMES))
    readers: dict[int, FrameReader] = {}

    def ours(conn):
        reader = readers.setdefault(conn.fileno(), FrameReader(conn, buffer_bytes))
        return reader.retrieve_msg()

    got = _read_all(ours, stream, len(FRAMES), seed=11)
    _same(got, expected)
    # The reader gives what it parsed, not a guess: the 32-request frame carried 32 distinct request ids.
    assert [request["requestId"] for request in got[2][1]] == [f"request-{i:04d}-9f1c".encode() for i in range(32)]
    big = got[5][1][0]["parameters"][0]["value"]
    assert (len(big) if decode == "false" else len(big["texts"])) == (200_016 if decode == "false" else 1)


def test_a_value_larger_than_the_buffer_is_received_into_its_exact_size():
    value = bytes(random.Random(3).getrandbits(8) for _ in range(100_000))
    frame = inference_frame([request_frame(0, [(b"body", b"application/octet-stream", value)])])
    [(cmd, msg)] = _read_all(lambda conn: FrameReader(conn, 4096).retrieve_msg(), frame, 1)
    body = msg[0]["parameters"][0]["value"]
    assert cmd == b"I" and body == value and isinstance(body, bytearray)


def test_an_unknown_command_is_refused_and_a_closed_frontend_ends_the_worker():
    with pytest.raises(ValueError, match="Invalid command"):
        _read_all(lambda conn: FrameReader(conn).retrieve_msg(), b"X" + END, 1)
    ours, theirs = socket.socketpair()
    theirs.sendall(inference_frame([request_frame(0, [])])[:20])
    theirs.close()
    with pytest.raises(SystemExit) as ended:
        FrameReader(ours).retrieve_msg()
    ours.close()
    assert ended.value.code == 0


def test_install_replaces_the_workers_reader_on_the_checked_release_only(monkeypatch):
    import ts.version

    assert ts.version.__version__ == CHECKED_RELEASE  # the pinned TorchServe is the release this was compared with
    assert worker_protocol.torchserve_worker() is None  # pytest is not a TorchServe worker: nothing is replaced
    assert worker_protocol.install() is False
    # TorchServe runs its worker as a script: the worker module is __main__, holding TorchServe's reader.
    worker = types.ModuleType("model_service_worker")
    worker.TorchModelServiceWorker = object
    worker.retrieve_msg = torchserve.retrieve_msg
    monkeypatch.setitem(sys.modules, "__main__", worker)
    assert worker_protocol.torchserve_worker() is worker
    assert worker_protocol.install() is True
    assert worker.retrieve_msg is not torchserve.retrieve_msg
    [(cmd, msg)] = _read_all(worker.retrieve_msg, FRAMES[1], 1)
    assert cmd == b"I" and msg[0]["requestId"] == b"request-0000-9f1c"
    assert worker_protocol.install(max_value_bytes=10) is True  # installed again: the new one replaces it

    worker.retrieve_msg = torchserve.retrieve_msg
    monkeypatch.setattr(ts.version, "__version__", "0.13.0")
    assert worker_protocol.install() is False
    assert worker.retrieve_msg is torchserve.retrieve_msg


def test_a_length_below_one_reads_as_empty_as_in_torchserve(monkeypatch):
    monkeypatch.setenv("TS_DECODE_INPUT_REQUEST", "false")
    frame = b"I" + _field(b"id") + END + _field(b"body") + _field(b"") + struct.pack("!i", 0) + END + END
    expected = _read_all(torchserve.retrieve_msg, frame + FRAMES[1], 2)
    readers: list[FrameReader] = []

    def ours(conn):  # one reader for the socket: it buffers past the first message
        readers[:] = readers or [FrameReader(conn)]
        return readers[0].retrieve_msg()

    _same(_read_all(ours, frame + FRAMES[1], 2), expected)
    assert expected[0][1][0]["parameters"] == [{"name": "body", "contentType": "", "value": bytearray()}]


@pytest.mark.parametrize("buffer_bytes", [16, 1 << 16])
def test_a_value_over_the_lanes_limit_is_let_go_unread_and_the_next_requests_read_whole(monkeypatch, buffer_bytes):
    monkeypatch.setenv("TS_DECODE_INPUT_REQUEST", "false")  # as the handler sets it
    over = b"x" * 300_001
    frame = inference_frame(
        [
            request_frame(0, [(b"body", b"application/json", DIGIT)]),
            request_frame(1, [(b"body", b"application/json", over)]),
            request_frame(2, [(b"body", b"application/json", b"y" * 300_000)]),  # at the limit: kept
        ]
    )
    stream = frame + FRAMES[1]  # and the message after it reads whole
    reader: list[FrameReader] = []

    def read(conn):
        if not reader:
            reader.append(FrameReader(conn, buffer_bytes, max_value_bytes=300_000))
        return reader[0].retrieve_msg()

    [(_, batch), (_, after)] = _read_all(read, stream, 2)
    values = [request["parameters"][0]["value"] for request in batch]
    assert values[0] == DIGIT and values[2] == b"y" * 300_000
    assert isinstance(values[1], UnreadValue) and len(values[1]) == 300_001
    assert [request["requestId"] for request in batch] == [f"request-{i:04d}-9f1c".encode() for i in range(3)]
    assert after[0]["parameters"][0]["value"] == DIGIT


def test_an_unread_value_gets_the_413_that_names_the_lanes_limit():
    limits = RequestLimits("minilm", None, {}, (), 1_048_576, {"minilm-bulk": 67_108_864})
    with pytest.raises(RequestError) as refused:
        read_request({"body": UnreadValue(64 * 2**20)}, {"body": {"content-type": "application/json"}}, limits)
    assert refused.value.code == 413
    assert "request body is 67108864 bytes; lane minilm takes at most 1048576 bytes" in str(refused.value)
    assert "minilm-bulk" in str(refused.value)


def test_torchserves_per_batch_line_follows_its_logger_level(caplog):
    with caplog.at_level(logging.INFO):
        _read_all(lambda conn: FrameReader(conn).retrieve_msg(), FRAMES[1], 1)
    assert "Backend received inference at" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _read_all(lambda conn: FrameReader(conn).retrieve_msg(), FRAMES[1], 1)
    assert "Backend received inference" not in caplog.text
