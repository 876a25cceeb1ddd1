"""Errors that belong to one request and travel back to its client as a JSON body with a 4xx/5xx status."""

from __future__ import annotations

import re
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


# What each loader's runtime says when an allocation fails (handlers/model_files.py): torch's allocators raise
# torch.OutOfMemoryError on CUDA; torch's CPU allocator, AOTInductor's runtime and onnxruntime's arenas raise a
# RuntimeError (or onnxruntime's own exception types) whose message says so, each in its own words.
_OUT_OF_MEMORY = re.compile(
    r"out of memory|failed to allocate memory|can't allocate memory|cannot allocate memory|not enough memory"
    r"|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|std::bad_alloc|CUBLAS_STATUS_ALLOC_FAILED",
    re.IGNORECASE,
)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is an allocation failure (device or host memory), from any loader's runtime: the core then
    splits the micro-batch instead of failing the batch. Read by type (torch.OutOfMemoryError, MemoryError) or,
    for runtimes that raise a generic error, by the message they give."""
    if isinstance(error, MemoryError) or any(cls.__name__ == "OutOfMemoryError" for cls in type(error).__mro__):
        return True
    return _OUT_OF_MEMORY.search(str(error)) is not None


def too_large(message: str) -> RequestError:
    """Over a configured limit (rows, pixels, text bytes): the message names the limit and what to do instead."""
    return RequestError(message, code=413, type="RequestTooLarge")


def unsupported_media(message: str) -> RequestError:
    return RequestError(message, code=415, type="UnsupportedMediaType")
