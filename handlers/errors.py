"""Errors that belong to one request and travel back to its client as a JSON body with a 4xx/5xx status."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RequestError(Exception):
    """A problem with one request (or one of its rows); never affects the other requests of a batch."""

    message: str
    code: int = 400
    type: str = "InvalidInput"

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict:
        return {"code": self.code, "type": self.type, "message": self.message}

    def at_row(self, index: int) -> RequestError:
        """The same error, located at `instances[index]` of a multi-row request."""
        return RequestError(f"instances[{index}]: {self.message}", self.code, self.type)


class SettingsError(ValueError):
    """model-config.yaml's handler: section is wrong: raised at start-up, before any request is served."""


def out_of_resources(message: str) -> RequestError:
    return RequestError(message, code=507, type="OutOfResources")


def too_large(message: str) -> RequestError:
    """Over a configured limit (rows, pixels, text bytes): the message names the limit and what to do instead."""
    return RequestError(message, code=413, type="RequestTooLarge")


def unsupported_media(message: str) -> RequestError:
    return RequestError(message, code=415, type="UnsupportedMediaType")
