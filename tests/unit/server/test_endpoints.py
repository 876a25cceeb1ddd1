"""key_file.json as TorchServe 0.12 writes it, and when a refused token is worth a second try.

The renewal itself (TorchServe's /token) and the refusals of a real server are in
tests/integration/security/; here the "server" is a callable that says whether it accepts a token.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from scripts.errors import ConfigError
from scripts.layout import CONFIG
from scripts.server.endpoints import Endpoints, Key, read_key
from scripts.server.process import free_port

REFUSED = "refused"


def write_keys(path, inference: str, expires: datetime | None = None) -> None:
    """A key file shaped like TorchServe's: Instant.toString() carries nanoseconds."""
    stamp = {} if expires is None else {"expiration time": expires.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"}
    keys = {"management": {"key": "m", **stamp}, "inference": {"key": inference, **stamp}, "API": {"key": "api"}}
    path.write_text(json.dumps(keys, indent=2))


@pytest.fixture
def endpoints(tmp_path) -> Endpoints:
    # Nothing listens on this management port: a renewal that reaches for TorchServe fails loudly.
    unused = f"http://127.0.0.1:{free_port()}"
    base = Endpoints.from_config(CONFIG, tmp_path / "key_file.json")
    return Endpoints(unused, unused, unused, "127.0.0.1", 1, 1, base.key_file)


def test_javas_instants_are_read_and_expiry_has_a_margin(tmp_path):
    soon = datetime.now(UTC) + timedelta(milliseconds=500)
    write_keys(tmp_path / "key_file.json", "i", soon)
    key = read_key(tmp_path / "key_file.json", "inference")
    assert key.value == "i" and abs(key.expires - soon) < timedelta(milliseconds=1)
    assert key.expired() and not key.expired(margin=timedelta(0))
    assert read_key(tmp_path / "key_file.json", "API") == Key("api", None)
    assert not Key("k", None).expired()


def test_a_refused_key_that_is_still_the_files_is_not_sent_again(endpoints):
    write_keys(endpoints.key_file, "wrong", datetime.now(UTC) + timedelta(hours=1))
    sent = []
    result = endpoints.with_token("inference", lambda token: sent.append(token) or REFUSED, lambda r: r == REFUSED)
    assert (result, sent) == (REFUSED, ["wrong"])


def test_a_key_rotated_while_the_request_travelled_is_replaced_once(endpoints):
    write_keys(endpoints.key_file, "old")
    sent = []

    def server(token: str) -> str:
        sent.append(token)
        if token == "old":  # someone rotated the key just before this request arrived
            write_keys(endpoints.key_file, "new")
            return REFUSED
        return "answer"

    assert endpoints.with_token("inference", server, lambda r: r == REFUSED) == "answer"
    assert sent == ["old", "new"]


def test_an_expired_key_is_renewed_through_the_management_api_before_use(endpoints):
    """None answers here, so the renewal's error comes back (tests/integration/security renews for real)."""
    write_keys(endpoints.key_file, "old", datetime.now(UTC) - timedelta(seconds=1))
    with pytest.raises(
        ConfigError, match=f"cannot renew the inference key: no TorchServe management API at {endpoints.management}"
    ):
        endpoints.token("inference")
    with pytest.raises(ConfigError, match="no key kind 'API'"):
        endpoints.rotate("API")


def test_a_key_that_would_expire_during_a_run_is_renewed_before_it(endpoints):
    """wrk sends one token for its whole run: a key with 10 s left serves a 5 s run, not a 20 s one (renewing it
    reaches for the management API, which does not answer here)."""
    write_keys(endpoints.key_file, "current", datetime.now(UTC) + timedelta(seconds=10))
    assert endpoints.token("inference", lasting_s=5) == "current"
    with pytest.raises(ConfigError, match="cannot renew the inference key"):
        endpoints.token("inference", lasting_s=20)
    assert endpoints.token("inference") == "current"  # a plain request needs only the margin


def test_a_key_file_that_stays_empty_is_named(tmp_path):
    (tmp_path / "key_file.json").write_text("")
    with pytest.raises(ConfigError, match="has no 'inference' key \\(or is still being written\\)"):
        read_key(tmp_path / "key_file.json", "inference")
