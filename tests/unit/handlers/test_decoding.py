"""Reading one request as TorchServe hands it over: the value (bytes, str or what Python's json parsed), its
content type, and the lane's limits; every refusal is a RequestError with a 4xx naming the problem."""

import io

import numpy as np
import pytest

from handlers.decoding import Payload, RequestLimits, read_body, read_request
from handlers.errors import RequestError

JSON = {"body": {"content-type": "application/json"}}
FORM = "application/x-www-form-urlencoded"
DIGITS = RequestLimits("digits", 4, {"digits-bulk": 10}, ("image/", "application/octet-stream"))


def test_raw_bytes_are_one_item():
    assert read_request({"body": bytearray(b"\x89PNG...")}) == Payload(items=[b"\x89PNG..."], raw=True)


def test_parsed_json_instances_are_many_items():
    payload = read_request({"body": {"instances": [[1] * 64, [2] * 64]}}, JSON)
    assert not payload.raw and len(payload.items) == 2


@pytest.mark.parametrize("media", ["", "application/octet-stream", "application/vnd.instances+json", "application/json"])
def test_json_instances_sent_as_bytes_are_parsed_whatever_the_type_says(media):
    payload = read_request({"data": b' {"instances": ["a", "b"]}'}, {"data": {"content-type": media}})
    assert payload == Payload(items=["a", "b"], raw=False)


def test_text_that_only_looks_like_json_stays_text():
    assert read_request({"body": "{not json"}, {"body": {"content-type": "text/plain"}}) == Payload(["{not json"], raw=True)
    assert read_body('{"instances": ["a"]}', "text/plain") == Payload(items=["a"], raw=False)


@pytest.mark.parametrize(
    ("fields", "headers", "message"),
    [
        # `curl --data-binary 'a sentence'`: TorchServe drops a trailing field without '='
        ({}, {"Content-Type": FORM}, "arrived as form fields.*Content-Type: text/plain"),
        # `curl --data-binary 'a sentence & more'`: ' more' is lost
        ({"a sentence": bytearray(b"")}, {"Content-Type": FORM}, "arrived as form fields.*Content-Type: text/plain"),
        ({"image": bytearray(b"x")}, {}, 'no "body" or "data" input \\(got: \'image\'\\).*gRPC: input='),
        ({"file": bytearray(b"x")}, {"Content-Type": "multipart/form-data; boundary=x"}, 'part named "data" or "body"'),
    ],
)
def test_form_bodies_are_refused_with_the_fix(fields, headers, message):
    # What TorchServe 0.12 really hands over for form bodies: the text cannot be put back together.
    with pytest.raises(RequestError, match=message) as caught:
        read_request(fields, headers)
    assert caught.value.code == 400


# (name, value as the worker gets it, its content type, expected code, expected substring of the message)
BAD_BODIES = [
    (
        "no instances key",
        {"inputs": []},
        "application/json",
        400,
        "must be an object with an 'instances' list, got keys ['inputs']",
    ),
    ("unknown field", {"instances": [1], "extra": 2}, "application/json", 400, "unknown field(s) ['extra']"),
    ("empty instances", {"instances": []}, "application/json", 400, "non-empty JSON list"),
    ("instances not a list", {"instances": "x"}, "application/json", 400, "non-empty JSON list"),
    ("JSON array", [1, 2], "application/json", 400, "got a JSON array"),
    ("JSON string", "text", "application/json", 400, "got a JSON string"),
    ("JSON number", 3.5, "application/json", 400, "got a JSON number"),
    ("JSON true", True, "application/json", 400, "got a JSON boolean"),
    ("JSON null", None, "application/json", 400, "got a JSON null"),
    ("invalid JSON", b'{"instances": [1,', "application/json", 400, "not valid JSON (Content-Type application/json)"),
    ("invalid +json", b"[1, 2", "application/vnd.instances+json", 400, "not valid JSON"),
    ("NaN as +json", b'{"instances": [NaN]}', "application/vnd.instances+json", 400, "not valid JSON"),
    ("too deep", b"[" * 2000 + b"]" * 2000, "application/json", 400, "not valid JSON"),
    ("broken JSON, no type", b'{"instances": ', "", 400, 'not valid JSON (it starts with "{")'),
    ("object without instances, no type", b'{"text": "a"}', "", 400, "got keys ['text']"),
    ("empty JSON body", b"", "application/json", 400, "empty request body (Content-Type application/json)"),
    ("blank JSON body", b"  \n", "application/json", 400, "empty request body"),
    ("empty raw body", b"", "", 400, "empty request body"),
    ("empty text body", "", "text/plain", 400, "empty request body"),
]


@pytest.mark.parametrize(("value", "media", "code", "message"), [case[1:] for case in BAD_BODIES], ids=[c[0] for c in BAD_BODIES])
def test_bad_bodies_are_4xx_naming_the_problem(value, media, code, message):
    with pytest.raises(RequestError) as caught:
        read_request({"body": value}, {"body": {"content-type": media}})
    assert caught.value.code == code
    assert message in caught.value.message


@pytest.mark.parametrize(
    ("rows", "limits", "message"),
    [
        (
            5,
            DIGITS,
            "request has 5 rows; lane digits takes at most 4 rows per request (handler.max_request_rows): "
            "send it to lane digits-bulk (up to 10 rows per request)",
        ),
        (11, DIGITS, "split it into requests of at most 10 rows for lane digits-bulk"),
        (5, RequestLimits("digits", 4, {"digits": 4, "digits-bulk": None}), "send it to lane digits-bulk (no row limit)"),
        (5, RequestLimits("digits-seq", 4, {}), "split it into requests of at most 4 rows"),
    ],
)
def test_a_request_over_the_lanes_row_limit_is_a_413_naming_the_limit_and_the_lane_to_use(rows, limits, message):
    with pytest.raises(RequestError) as caught:
        read_request({"body": {"instances": [[0] * 64] * rows}}, JSON, limits)
    assert (caught.value.code, caught.value.type) == (413, "RequestTooLarge")
    assert message in caught.value.message


def test_a_request_at_the_row_limit_passes():
    assert len(read_request({"body": {"instances": [[0] * 64] * 4}}, JSON, DIGITS).items) == 4


@pytest.mark.parametrize("media", ["image/png", "image/jpeg", "application/octet-stream", ""])
def test_a_raw_body_of_a_media_type_the_task_reads_passes(media):
    assert read_request({"body": b"\x89PNG"}, {"body": {"content-type": media}}, DIGITS).raw


@pytest.mark.parametrize("media", ["text/plain", "audio/wav", "application/pdf"])
def test_a_raw_body_of_another_media_type_is_a_415_naming_what_is_read(media):
    value = "text" if media.startswith("text/") else b"bytes"
    with pytest.raises(RequestError) as caught:
        read_request({"body": value}, {"body": {"content-type": media}}, DIGITS)
    assert caught.value.code == 415
    assert f"Content-Type {media} is not read here: send one item as image/*, application/octet-stream" in caught.value.message


BYTES = RequestLimits("digits", 4, {"digits-bulk": 10}, (), max_bytes=100, lanes_bytes={"digits-bulk": 1000})


def test_a_body_over_the_lanes_byte_limit_is_a_413_before_it_is_parsed():
    # Not JSON at all: the size is refused before any parse could say so.
    with pytest.raises(RequestError) as caught:
        read_request({"body": b"{" * 101}, JSON, BYTES)
    assert (caught.value.code, caught.value.type) == (413, "RequestTooLarge")
    assert caught.value.message == (
        "request body is 101 bytes; lane digits takes at most 100 bytes per request (handler.max_request_bytes): "
        "send it to lane digits-bulk (up to 1000 bytes per request)"
    )
    with pytest.raises(RequestError, match="split it into requests of at most 1000 bytes for lane digits-bulk"):
        read_request({"body": b"x" * 1001}, {}, BYTES)


def test_a_body_at_the_byte_limit_is_read():
    body = b'{"instances": [' + b",".join([b"[" + b",".join([b"1"] * 8) + b"]"] * 4) + b"]}"
    body += b" " * (100 - len(body))
    assert len(body) == 100
    assert read_request({"body": body}, JSON, BYTES) == Payload(items=[[1] * 8] * 4, raw=False)


def test_text_sent_as_bytes_is_one_text_unless_it_is_json_instances():
    # TorchServe's worker hands text/* over as bytes when the handler turns its decoding off.
    text = {"body": {"content-type": "text/plain; charset=utf-8"}}
    assert read_request({"body": b"{not json"}, text) == Payload([b"{not json"], raw=True)
    assert read_request({"body": b'{"instances": ["a"]}'}, text) == Payload(["a"], raw=False)


def _npy(array) -> bytes:
    stream = io.BytesIO()
    np.save(stream, array, allow_pickle=False)
    return stream.getvalue()


@pytest.mark.parametrize("array", [np.arange(6 * 64).reshape(6, 64) % 17, np.zeros((2, 8, 8), np.float32), np.ones((1, 3), bool)])
def test_an_npy_body_is_one_instance_per_entry_of_its_first_axis(array):
    payload = read_request({"body": _npy(array)}, {"body": {"content-type": "application/x-npy"}})
    assert payload.raw is False
    assert len(payload.items) == len(array)
    assert all(np.array_equal(item, row) and item.dtype == array.dtype for item, row in zip(payload.items, array, strict=True))


def test_a_fortran_ordered_npy_body_keeps_its_rows():
    array = np.asfortranarray(np.arange(3 * 64).reshape(3, 64))
    payload = read_body(_npy(array), "application/x-npy")
    assert np.array_equal(np.stack(payload.items), array)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "body is not a numpy .npy array"),
        (b'{"instances": [[1]]}', "body is not a numpy .npy array"),
        (_npy(np.zeros((2, 64)))[:-8], r"header says shape \(2, 64\) of float64 \(1024 bytes of data\), but 1016 bytes follow"),
        (_npy(np.zeros((2, 64)))[:128] + b"\0" * 8, r"but 8 bytes follow"),  # a header claiming more than was sent
        (_npy(np.zeros(64)), r"must be an array of instances .* got shape \(64,\)"),
        (_npy(np.zeros((0, 64))), r"got shape \(0, 64\)"),
        (_npy(np.array([["a", "b"]])), "must hold numbers, got an array of dtype <U1"),
        (_npy(np.zeros((1, 2), complex)), "must hold numbers, got an array of dtype complex128"),
        (_npy(np.zeros(2, dtype="i4,f4").reshape(1, 2)), "must hold numbers"),
    ],
)
def test_a_bad_npy_body_is_a_400_naming_the_problem(body, message):
    with pytest.raises(RequestError, match=message) as error:
        read_body(body, "application/x-npy")
    assert error.value.code == 400


def test_an_npy_body_of_python_objects_is_refused_without_unpickling():
    stream = io.BytesIO()
    np.save(stream, np.array([[object()]], dtype=object), allow_pickle=True)
    with pytest.raises(RequestError, match="got an array of Python objects"):
        read_body(stream.getvalue(), "application/x-npy")


def test_an_npy_body_over_the_row_limit_is_a_413_naming_the_lane_to_use():
    limits = RequestLimits("digits", max_rows=2, lanes_rows={"digits-bulk": 100})
    with pytest.raises(RequestError, match="has 3 rows; lane digits takes at most 2 rows .* send it to lane digits-bulk"):
        read_request({"body": _npy(np.zeros((3, 64)))}, {"body": {"content-type": "application/x-npy"}}, limits)
