"""Turn one TorchServe request (its parameter dict and content type) into a Payload: one raw item or JSON
instances, checked against the lane's limits before any item is decoded (docs/hardening.md)."""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from handlers.errors import RequestError, too_large, unsupported_media

INSTANCES = "instances"
BLANK_BYTES, BLANK_TEXT = re.compile(rb"[ \t\r\n]*"), re.compile(r"[ \t\r\n]*")
# A numpy array as the body (numpy.save's format, never pickled): one instance per entry of its first axis. What
# batch jobs send a bulk lane when their rows are numbers (scripts/jobs/runners.py): no JSON to write or parse, no
# Python object per value on either side.
NPY_MEDIA = "application/x-npy"
# numpy's kinds of numbers: bool, signed and unsigned integers, floats.
NPY_KINDS = "biuf"
NPY_VERSIONS = {(1, 0), (2, 0), (3, 0)}
# A JSON value's type as a client would name it, for messages.
JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


class UnreadValue:
    """Stands for a request value that was longer than the lane takes: its length, not its bytes (the worker's
    message reader, handlers/torchserve/worker_protocol.py, leaves such values unread; read_request answers 413)."""

    __slots__ = ("length",)

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"UnreadValue({self.length})"


@dataclass(frozen=True)
class Payload:
    """What one request asked for: `items` are raw bodies (bytes/str) when `raw`, else JSON instances (a list), or the
    rows of an application/x-npy body (the array itself: a row per entry of its first axis, no object made per row
    before the request's rows are counted)."""

    items: Sequence[Any]
    raw: bool


@dataclass(frozen=True)
class RequestLimits:
    """What one lane admits before any item is decoded: rows per request and the media types of a raw body."""

    lane: str = ""
    # handler.max_request_rows for this lane (None: no limit), and every lane it names, to point a too-large
    # request at the lane that takes it.
    max_rows: int | None = None
    lanes_rows: Mapping[str, int | None] = field(default_factory=dict)
    # Media type prefixes the task reads as a raw body (Task.raw_media); a body without one (gRPC) always passes.
    raw_media: tuple[str, ...] = ()

    # handler.max_request_bytes for this lane (None: no limit of the handler's) and every lane it names.
    max_bytes: int | None = None
    lanes_bytes: Mapping[str, int | None] = field(default_factory=dict)

    def check_bytes(self, size: int) -> None:
        """Before the body is parsed: JSON of many small items costs tens of times its size as Python objects."""
        self._check(size, self.max_bytes, self.lanes_bytes, "body is", "bytes", "handler.max_request_bytes")

    def check_rows(self, count: int) -> None:
        self._check(count, self.max_rows, self.lanes_rows, "has", "rows", "handler.max_request_rows")

    def _check(self, count: int, limit: int | None, lanes: Mapping[str, int | None], verb: str, unit: str, option: str) -> None:
        if limit is None or count <= limit:
            return
        raise too_large(
            f"request {verb} {count} {unit}; lane {self.lane} takes at most {limit} {unit} per request "
            f"({option}): {_instead(self.lane, limit, lanes, count, unit)}"
        )

    def check_raw_media(self, media: str) -> None:
        if not media or not self.raw_media or media.startswith(self.raw_media):
            return
        accepted = ", ".join(f"{prefix}*" if prefix.endswith("/") else prefix for prefix in self.raw_media)
        raise unsupported_media(
            f"Content-Type {media} is not read here: send one item as {accepted}, "
            f'or many as application/json {{"instances": [...]}}'
        )


NO_LIMITS = RequestLimits()


def _instead(lane: str, limit: int, lanes: Mapping[str, int | None], count: int, unit: str) -> str:
    """What to do with a request of `count` `unit` over `lane`'s `limit`: the lane that takes the most, if any."""
    larger = {other: most for other, most in lanes.items() if other != lane and (most is None or most > limit)}
    if not larger:
        return f"split it into requests of at most {limit} {unit}"
    other, most = max(larger.items(), key=lambda entry: float("inf") if entry[1] is None else entry[1])
    if most is None:
        return f"send it to lane {other} (no {unit[:-1]} limit)"
    if count <= most:
        return f"send it to lane {other} (up to {most} {unit} per request)"
    return f"split it into requests of at most {most} {unit} for lane {other}"


def read_request(
    request: Mapping[str, Any], headers: Mapping[str, Any] | None = None, limits: RequestLimits = NO_LIMITS
) -> Payload:
    """Decode one entry of the list TorchServe passes to handle(). `headers`: context.get_all_request_header(i),
    which holds each parameter's {"content-type": ...} and the HTTP headers; {} when unknown."""
    headers = headers or {}
    name = "body" if "body" in request else "data" if "data" in request else None
    if name is None:
        raise _form_fields(request, _media(next((v for k, v in headers.items() if k.lower() == "content-type"), "")))
    media = _media(headers.get(name))
    body = request[name]
    if isinstance(body, (bytes, bytearray, str, UnreadValue)):
        limits.check_bytes(len(body))
    payload = read_body(body, media)
    if payload.raw:
        limits.check_raw_media(media)
    else:
        limits.check_rows(len(payload.items))
    return payload


def read_body(value: Any, media: str = "") -> Payload:
    """A body as TorchServe hands it over: bytes, str (text/*), or what Python's json parsed (application/json).

    `media` is the body's media type ("" when none was sent: gRPC, or unknown). A JSON type means JSON: a body
    that does not parse is a 400, never an item. Without one, a body whose first character is "{" is JSON too
    (gRPC has no content type); text/* keeps a text that only looks like JSON a text.
    """
    if media == NPY_MEDIA:
        return _npy_instances(value)
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value)
        if _is_json(media) or (not media.startswith("text/") and _first(value) == b"{"):
            return _instances(_parse_json(value, media))
        parsed = _maybe_json_object(value) if media.startswith("text/") else None
        return _instances(parsed) if parsed is not None else _raw(value)
    if isinstance(value, str) and not _is_json(media):
        parsed = _maybe_json_object(value)
        return _instances(parsed) if parsed is not None else _raw(value)
    if value is None and not _is_json(media):
        raise RequestError('empty request: send a raw item as the body or JSON {"instances": [...]}')
    return _instances(value)


def _raw(value: bytes | str) -> Payload:
    if len(value) == 0:
        raise RequestError('empty request body: send a raw item or JSON {"instances": [...]}')
    return Payload(items=[value], raw=True)


def _instances(body: Any) -> Payload:
    if not isinstance(body, dict):
        kind = "null" if body is None else JSON_TYPES.get(type(body), type(body).__name__)
        raise RequestError(f'JSON body must be an object {{"instances": [...]}}, got a JSON {kind}')
    if INSTANCES not in body:
        raise RequestError(f"JSON body must be an object with an 'instances' list, got keys {_names(body)}")
    unknown = sorted(set(body) - {INSTANCES})
    if unknown:
        raise RequestError(f"unknown field(s) {_names(unknown)} in the JSON body: only 'instances' is read")
    instances = body[INSTANCES]
    if not isinstance(instances, list) or not instances:
        raise RequestError("'instances' must be a non-empty JSON list of items")
    return Payload(items=instances, raw=False)


def _npy_instances(value: Any) -> Payload:
    """An application/x-npy body: a numeric array of at least two axes, its first axis the instances (rows of numpy
    values that a task decodes like the lists of a JSON body, with the same messages)."""
    if not isinstance(value, (bytes, bytearray)):
        raise RequestError(f"an {NPY_MEDIA} body must be bytes (numpy.save's format), got {type(value).__name__}")
    array = _read_npy(bytes(value))
    if array.dtype.kind not in NPY_KINDS:
        raise RequestError(f"an {NPY_MEDIA} body must hold numbers, got an array of dtype {array.dtype}")
    if array.ndim < 2 or array.shape[0] == 0:
        raise RequestError(
            f"an {NPY_MEDIA} body must be an array of instances (rows along its first axis, at least one), "
            f"got shape {array.shape}"
        )
    return Payload(items=array, raw=False)


def _read_npy(data: bytes) -> np.ndarray:
    """numpy.save's format, read without pickle and without trusting the header: the data must be exactly as long as
    the header's shape and dtype say (numpy's own reader allocates what the header claims before reading)."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version not in NPY_VERSIONS:
            raise ValueError(f"format version {version[0]}.{version[1]} (numpy writes 1.0, 2.0 or 3.0)")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(stream)
    except (ValueError, SyntaxError, TypeError) as error:  # numpy's words for a bad magic string or header
        raise RequestError(f"body is not a numpy .npy array (Content-Type {NPY_MEDIA}): {str(error)[:200]}") from None
    if dtype.hasobject:
        raise RequestError(f"an {NPY_MEDIA} body must hold numbers, got an array of Python objects")
    expected = math.prod(shape) * dtype.itemsize
    offset = stream.tell()
    if len(data) - offset != expected:
        raise RequestError(
            f"an {NPY_MEDIA} body's header says shape {shape} of {dtype} ({expected} bytes of data), "
            f"but {len(data) - offset} bytes follow it"
        )
    array = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=offset)
    return array.reshape(shape[::-1]).transpose() if fortran_order else array.reshape(shape)


def _parse_json(data: bytes, media: str) -> Any:
    if not _first(data):
        raise RequestError(f'empty request body (Content-Type {media or "none"}): send JSON {{"instances": [...]}}')
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as error:
        why = f"Content-Type {media}" if media else 'it starts with "{"'
        raise RequestError(f"body is not valid JSON ({why}): {error}") from None


def _maybe_json_object(text: bytes | str) -> dict | None:
    """A JSON object with 'instances' sent as text/*; anything else stays a text."""
    if _first(text) not in ("{", b"{"):
        return None
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) and INSTANCES in parsed else None


def _first(data: bytes | str) -> bytes | str:
    """The first character that is not JSON whitespace ("" if none), without copying the body."""
    start = (BLANK_BYTES if isinstance(data, bytes) else BLANK_TEXT).match(data).end()
    return data[start : start + 1]


def _is_json(media: str) -> bool:
    return media == "application/json" or media.endswith("+json")


def _media(header: Any) -> str:
    """The media type, lower case, without parameters: from a parameter's {"content-type": ...} or a header value."""
    if isinstance(header, Mapping):
        header = header.get("content-type")
    return str(header or "").split(";")[0].strip().lower()


def _names(names) -> str:
    shown = [repr(str(name)[:40]) for name in sorted(map(str, names))[:5]]
    return "[" + ", ".join(shown) + (", ...]" if len(names) > 5 else "]")


def _form_fields(request: Mapping[str, Any], media: str) -> RequestError:
    """No "body" or "data" parameter. application/x-www-form-urlencoded (curl -d / --data-binary without -H):
    TorchServe's frontend parses the body as a form, URL-decodes it and drops any trailing text without '='
    ('a sentence' arrives as no fields at all). multipart/form-data: each part is a field by its name.
    gRPC: the input map's keys are the fields. Refuse it rather than guess."""
    fields = ", ".join(repr(str(name)[:40]) for name in list(request)[:3]) or "none"
    if media == "application/x-www-form-urlencoded":
        return RequestError(
            "the body arrived as form fields (got: " + fields + "): TorchServe parses bodies sent as "
            "application/x-www-form-urlencoded, curl --data's default, and loses text that is not name=value pairs; "
            "send a real Content-Type: text/plain for one text, an image type for one image, "
            'or application/json for {"instances": [...]}'
        )
    if media.startswith("multipart/"):
        return RequestError(
            f'a {media} body must carry its item in a part named "data" or "body" (got parts: {fields}); '
            "or send the item itself as the body with its own Content-Type"
        )
    return RequestError(
        f'the request has no "body" or "data" input (got: {fields}): send the item or JSON {{"instances": [...]}} '
        'as the body (gRPC: input={"body": ...})'
    )
