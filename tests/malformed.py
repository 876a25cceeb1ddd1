"""Malformed request bodies, built once for the bad-input tests (unit, REST, gRPC and mixed batches)."""

from __future__ import annotations

import struct
import zlib

import orjson

from models.digits.samples import held_out, scanned_png

# The content types the bad-input tables send.
JSON = "application/json"
PNG = "image/png"
TEXT = "text/plain; charset=utf-8"

NOT_AN_IMAGE = b"these bytes are no image"
NUL_BYTES = b"\x00" * 64
NOT_UTF8 = b"caf\xe9 latin-1, not UTF-8"
# 5000 levels: past Python's json (TorchServe's worker then hands over the bytes) and orjson's 1024.
DEEP_JSON = b'{"instances": ' + b"[" * 5000 + b"]" * 5000 + b"}"
NAN_JSON = b'{"instances": [[' + b"0," * 63 + b"NaN]]}"
INFINITY_JSON = b'{"instances": [[' + b"0," * 63 + b"1e999]]}"
LONE_SURROGATE_JSON = b'{"instances": ["bad \\ud800 text"]}'


def png_header(width: int, height: int, data: bytes | None = None) -> bytes:
    """A greyscale PNG whose header claims width x height; its pixel data is `data` (default: one white row).
    A huge size costs a few bytes here and gigabytes to whoever decodes it."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    pixels = zlib.compress(b"\x00" + b"\xff" * min(width, 4096)) if data is None else data
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def truncated_png() -> bytes:
    return scanned_png(held_out(1)[0][0])[:300]


def instances(items: list) -> bytes:
    return orjson.dumps({"instances": items})


def rows(count: int) -> bytes:
    """`count` rows of one number each: the row limit is checked before any row is decoded."""
    return b'{"instances": [' + b",".join([b"0"] * count) + b"]}"


def digits_row(*values) -> list:
    """64 valid values (0..16) with the first ones replaced by `values`."""
    return [*values, *[0] * (64 - len(values))]
