import pytest

from handlers.decoding import Payload, read_request
from handlers.errors import RequestError


def test_raw_bytes_are_one_item():
    assert read_request({"body": bytearray(b"\x89PNG...")}) == Payload(items=[b"\x89PNG..."], raw=True)


def test_parsed_json_instances_are_many_items():
    payload = read_request({"body": {"instances": [[1] * 64, [2] * 64]}})
    assert payload.many and len(payload.items) == 2


def test_json_instances_sent_as_bytes_without_json_content_type():
    payload = read_request({"data": b' {"instances": ["a", "b"]}'})
    assert payload == Payload(items=["a", "b"], raw=False)


def test_text_that_only_looks_like_json_stays_raw():
    assert read_request({"body": "{not json"}) == Payload(items=["{not json"], raw=True)


def test_form_encoded_body_is_put_back_together():
    # What TorchServe hands over for `curl --data-binary 'a sentence & more'`.
    assert read_request({"a sentence ": b"", " more": b""}).items == [b"a sentence & more"]


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
