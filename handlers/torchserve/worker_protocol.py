"""The worker's side of TorchServe's frontend protocol, read through one buffer instead of a recv per field.

TorchServe 0.12's worker (`ts/model_service_worker.py`) reads each message with
`ts.protocol.otf_message_handler.retrieve_msg`, which calls `socket.recv` once per length and once per value:
about 20 system calls and bytearray appends per request, 25 µs of a worker's time per request of a 32-request
batch on this project's 2-core box, more than the digits forward pass costs per row. Its `_retrieve_buffer` also
grows a bytearray from whatever each `recv` returned, so a 64 MiB body costs the worker its size and then some
before the handler can refuse it.

`FrameReader` reads the same frames (formats below, from `otf_message_handler`) through one receive buffer and
returns the same structures, types included, so TorchServe's `Service.predict` and our handler see no difference:

    load:      b"L" | int len, model name | int len, model path | int batch size | int len, handler |
               int gpu id | int len, envelope | bool limitMaxImagePixels
    inference: b"I" | request* | int -1
    request:   int len, request id | (int len, name | int len, value)* int -1 |
               (int len, name | int len, content type | int len, value)* int -1

A value larger than the buffer is received straight into a bytearray of its exact size. A request value larger
than the lane's `max_request_bytes` is not kept at all: its bytes are received into the buffer and let go, and
the request carries an `UnreadValue` of that length instead, which the handler answers 413 naming the limit
(handlers/decoding.py) as it would the bytes. A stream worker then never holds a body past its lane's limit:
with TorchServe's reader a 64 MiB body on the minilm stream lane took the worker from about 440 to 514-515 MiB.
`install` swaps it in for the worker's `retrieve_msg` once the handler is loaded (the worker looks the name up in
its module on every message). It is the one place where this project replaces a TorchServe function at run time,
never its files: only on the TorchServe release it was checked against (tests/unit/handlers/test_worker_protocol.py
compares it with TorchServe's own reader frame by frame), and `handler.fast_protocol: false` keeps TorchServe's.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import sys
import time

from handlers.decoding import UnreadValue

logger = logging.getLogger(__name__)

# The TorchServe release whose frames and reader this module was compared with.
CHECKED_RELEASE = "0.12.0"
BUFFER_BYTES = 1 << 16
LOAD_MSG = b"L"
PREDICT_MSG = b"I"
_INT = struct.Struct("!i")
_BOOL = struct.Struct("!?")
END = -1


class FrameReader:
    """Reads the frontend's messages from one worker socket; `retrieve_msg()` answers as TorchServe's does.

    `max_value_bytes`: request values longer than this are let go unread (an UnreadValue in their place);
    None keeps every value, as TorchServe does."""

    def __init__(self, conn: socket.socket, buffer_bytes: int = BUFFER_BYTES, max_value_bytes: int | None = None) -> None:
        self.conn = conn
        self.max_value_bytes = max_value_bytes
        self.buffer = bytearray(buffer_bytes)
        self.view = memoryview(self.buffer)
        self.start = 0  # first unread byte
        self.end = 0  # one past the last received byte

    def retrieve_msg(self) -> tuple[bytearray, object]:
        cmd = bytearray(self._take(1))
        if cmd == PREDICT_MSG:
            msg = self._inference()
            # TorchServe's own line, on its logger and level: `logging.torchserve: info` in model-config.yaml shows it.
            logging.info("Backend received inference at: %d", time.time())
        elif cmd == LOAD_MSG:
            msg = self._load()
        else:
            raise ValueError(f"Invalid command: {cmd}")
        return cmd, msg

    # Frames ---------------------------------------------------------------------------------------------------

    def _load(self) -> dict:
        msg = {"modelName": self._field(), "modelPath": self._field(), "batchSize": self._int()}
        msg["handler"] = self._field()
        gpu_id = self._int()
        if gpu_id >= 0:
            msg["gpu"] = gpu_id
        msg["envelope"] = self._field()
        self._need(_BOOL.size)
        msg["limitMaxImagePixels"] = _BOOL.unpack_from(self.buffer, self.start)[0]
        self.start += _BOOL.size
        return msg

    def _inference(self) -> list[dict]:
        # Read on every message, as TorchServe does: the handler may change it while loading.
        decode = os.environ.get("TS_DECODE_INPUT_REQUEST") in (None, "true")
        batch = []
        while True:
            length = self._int()
            if length == END:
                return batch
            request = {"requestId": self._value(length)}
            headers = []
            while (length := self._int()) != END:
                headers.append({"name": self._value(length), "value": self._field()})
            request["headers"] = headers
            parameters = []
            while (length := self._int()) != END:
                name = self._value(length).decode("utf-8")
                content_type = self._field().decode("utf-8")
                length = self._int()
                if self.max_value_bytes is not None and length > self.max_value_bytes:
                    self._skip(length)
                    value = UnreadValue(length)
                else:
                    value = _decoded(self._value(length), content_type, decode)
                parameters.append({"name": name, "contentType": content_type, "value": value})
            request["parameters"] = parameters
            batch.append(request)

    # Bytes ----------------------------------------------------------------------------------------------------

    def _int(self) -> int:
        if self.end - self.start < 4:
            self._need(4)
        value = _INT.unpack_from(self.buffer, self.start)[0]
        self.start += 4
        return value

    def _field(self) -> bytearray:
        return self._value(self._int())

    def _value(self, length: int) -> bytearray:
        if length <= 0:  # TorchServe's reader reads nothing for a length below 1
            return bytearray()
        if length <= len(self.buffer):
            if self.end - self.start < length:
                self._need(length)
            value = bytearray(self.view[self.start : self.start + length])
            self.start += length
            return value
        # Larger than the buffer: what is buffered, then the rest straight into a bytearray of the exact size.
        value = bytearray(length)
        have = self.end - self.start
        value[:have] = self.view[self.start : self.end]
        self.start = self.end = 0
        self._receive_into(memoryview(value)[have:])
        return value

    def _skip(self, length: int) -> None:
        """Receives `length` bytes through the buffer and keeps none of them."""
        have = min(length, self.end - self.start)
        self.start += have
        length -= have
        if length:
            self.start = self.end = 0
        while length:
            received = self.conn.recv_into(self.view[: min(length, len(self.buffer))])
            if received == 0:
                _frontend_gone()
            length -= received

    def _take(self, length: int) -> memoryview:
        self._need(length)
        taken = self.view[self.start : self.start + length]
        self.start += length
        return taken

    def _need(self, length: int) -> None:
        """Receives until `length` unread bytes are buffered (length <= the buffer's size)."""
        if self.end - self.start >= length:
            return
        if self.start:
            # Move what is left to the front: a frame's fields are read in order, so this copies little.
            left = self.end - self.start
            self.view[:left] = self.view[self.start : self.end]
            self.start, self.end = 0, left
        while self.end < length:
            received = self.conn.recv_into(self.view[self.end :])
            if received == 0:
                _frontend_gone()
            self.end += received

    def _receive_into(self, target: memoryview) -> None:
        while len(target):
            received = self.conn.recv_into(target)
            if received == 0:
                _frontend_gone()
            target = target[received:]


def _decoded(value: bytearray, content_type: str, decode: bool):
    """The value as TorchServe's worker hands it on: JSON parsed and text decoded unless decoding is off."""
    if decode and content_type == "application/json":
        try:
            return json.loads(value.decode("utf-8"))
        except Exception:
            logging.warning("Failed json decoding of input data. Forwarding encoded payload", exc_info=True)
            return value
    if decode and content_type.startswith("text"):
        try:
            return value.decode("utf-8")
        except Exception:
            logging.warning("Failed utf-8 decoding of input data. Forwarding encoded payload", exc_info=True)
            return value
    return value


def _frontend_gone() -> None:
    logging.info("Frontend disconnected.")
    sys.exit(0)


def torchserve_worker():
    """The running TorchServe worker's module, None in any other process. TorchServe starts its worker as a script
    (python .../ts/model_service_worker.py), so the worker is __main__; a process that merely imports
    ts.model_service_worker (a test, a tool) is not one."""
    try:
        from ts.protocol.otf_message_handler import retrieve_msg as torchserve_reader
    except ImportError:
        return None
    module = sys.modules.get("__main__")
    reader = getattr(module, "retrieve_msg", None)
    if hasattr(module, "TorchModelServiceWorker") and (
        reader is torchserve_reader or getattr(reader, "torchserve_reader", None) is torchserve_reader
    ):
        return module
    return None


def install(max_value_bytes: int | None = None) -> bool:
    """Makes this worker read the frontend's messages with a FrameReader (values over `max_value_bytes` unread);
    False (and TorchServe's reader kept) where the process is not a TorchServe worker of the release this was
    checked against. The worker's default, synchronous loop only (`handle_connection`; TorchServe's async mode
    reads through ts/async_service.py)."""
    worker = torchserve_worker()
    try:
        from ts.version import __version__ as release
    except ImportError as error:
        logger.warning("TorchServe's own message reader kept: %s", error)
        return False
    if worker is None or release != CHECKED_RELEASE:
        logger.warning(
            "TorchServe's own message reader kept: %s",
            "not in a TorchServe worker" if worker is None else f"TorchServe {release}, checked with {CHECKED_RELEASE}",
        )
        return False
    from ts.protocol.otf_message_handler import retrieve_msg as torchserve_reader

    readers: dict[int, FrameReader] = {}

    def retrieve_msg(conn):
        reader = readers.get(conn.fileno())
        if reader is None or reader.conn is not conn:
            reader = readers[conn.fileno()] = FrameReader(conn, max_value_bytes=max_value_bytes)
        return reader.retrieve_msg()

    retrieve_msg.torchserve_reader = torchserve_reader  # installed again (a reload), it replaces this one
    worker.retrieve_msg = retrieve_msg
    return True
