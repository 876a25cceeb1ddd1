"""Turn one TorchServe request (its parameter dict) into a Payload: raw single item or JSON instances."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from handlers.errors import RequestError


@dataclass(frozen=True)
class Payload:
    """What one request asked for: `items` are raw bodies (bytes/str) when `raw`, else JSON instances."""

    items: list[Any]
    raw: bool


def read_request(request: Mapping[str, Any]) -> Payload:
    """Decode one entry of the list TorchServe passes to handle()."""
    if "body" not in request and "data" not in request:
        raise _form_fields(request)
    value = request["body"] if "body" in request else request["data"]
    return read_body(value)


def read_body(value: Any) -> Payload:
    """A body as TorchServe hands it over: bytes, str (text/*), or parsed JSON (application/json)."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value)
        parsed = _maybe_json_object(value)
        return _instances(parsed) if parsed is not None else _raw(value)
    if isinstance(value, str):
        parsed = _maybe_json_object(value.encode("utf-8"))
        return _instances(parsed) if parsed is not None else _raw(value)
    if isinstance(value, dict):
        if "instances" not in value:
            raise RequestError(f"JSON body must be an object with an 'instances' list, got keys {sorted(value)[:5]}")
        return _instances(value)
    if value is None:
        raise RequestError('empty request: send a raw item as the body or JSON {"instances": [...]}')
    raise RequestError(f'JSON body must be an object {{"instances": [...]}}, got a JSON {type(value).__name__}')


def _raw(value: bytes | str) -> Payload:
    if len(value) == 0:
        raise RequestError('empty request body: send a raw item or JSON {"instances": [...]}')
    return Payload(items=[value], raw=True)


def _instances(body: dict) -> Payload:
    instances = body.get("instances")
    if not isinstance(instances, list) or not instances:
        raise RequestError("'instances' must be a non-empty JSON list of items")
    return Payload(items=instances, raw=False)


def _maybe_json_object(data: bytes) -> dict | None:
    """A JSON object with 'instances' sent without a JSON content type; anything else stays raw."""
    if not data.lstrip()[:1] == b"{":
        return None
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) and "instances" in parsed else None


def _form_fields(request: Mapping[str, Any]) -> RequestError:
    """A body sent as application/x-www-form-urlencoded (curl -d / --data-binary without -H) never
    reaches us whole: TorchServe's frontend parses it as a form, URL-decodes it and drops any trailing
    text without '=' ('a sentence' arrives as no fields at all). Refuse it rather than guess."""
    fields = ", ".join(repr(str(name)[:40]) for name in list(request)[:3]) or "none"
    return RequestError(
        "the body arrived as form fields (got: " + fields + "): TorchServe parses bodies sent as "
        "application/x-www-form-urlencoded, curl --data's default, and loses text that is not name=value pairs; "
        "send a real Content-Type: text/plain for one text, an image type for one image, "
        'or application/json for {"instances": [...]}'
    )
