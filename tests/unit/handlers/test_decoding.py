import pytest

from handlers.decoding import Payload, read_request
from handlers.errors import RequestError


def test_raw_bytes_are_one_item():
    assert read_request({"body": bytearray(b"\x89PNG...")}) == Payload(items=[b"\x89PNG..."], raw=True)


def test_parsed_json_instances_are_many_items():
    payload = read_request({"body": {"instances": [[1] * 64, [2] * 64]}})
    assert not payload.raw and len(payload.items) == 2


def test_json_instances_sent_as_bytes_without_json_content_type():
    payload = read_request({"data": b' {"instances": ["a", "b"]}'})
    assert payload == Payload(items=["a", "b"], raw=False)


def test_text_that_only_looks_like_json_stays_raw():
    assert read_request({"body": "{not json"}) == Payload(items=["{not json"], raw=True)


@pytest.mark.parametrize(
    "fields",
    [
        {},  # `curl --data-binary 'a sentence'`: TorchServe drops a trailing field without '='
        {"a sentence": bytearray(b"")},  # `curl --data-binary 'a sentence & more'`: ' more' is lost
    ],
)
def test_form_encoded_bodies_are_refused_with_the_fix(fields):
    # What TorchServe 0.12 really hands over for form bodies: the text cannot be put back together.
    with pytest.raises(RequestError, match="arrived as form fields.*Content-Type: text/plain") as caught:
        read_request(fields)
    assert caught.value.code == 400


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"body": {"inputs": []}}, "must be an object with an 'instances' list"),
        ({"body": {"instances": []}}, "non-empty JSON list"),
        ({"body": {"instances": "x"}}, "non-empty JSON list"),
        ({"body": [1, 2]}, "got a JSON list"),
        ({"body": b""}, "empty request body"),
    ],
)
def test_bad_bodies_are_400s_naming_the_problem(request_, message):
    with pytest.raises(RequestError, match=message) as caught:
        read_request(request_)
    assert caught.value.code == 400
