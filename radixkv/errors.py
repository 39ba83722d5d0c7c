"""Typed errors a user (or a calling layer) can act on.

Every error names what is at fault -- the flag, field, file, page id or request -- and is raised
before any state is changed, so a caught error never leaves the pool or the tree half-updated.
"""

from __future__ import annotations

import enum


class RadixKVError(Exception):
    """Base class of every error radixkv raises on purpose."""


class ConfigError(RadixKVError, ValueError):
    """A configuration value is invalid; the message names the field and the accepted range."""


class OutOfPagesError(RadixKVError):
    """The KV pool has fewer free pages than an allocation needs (after eviction, if any)."""

    def __init__(self, requested: int, free: int, page_size: int):
        super().__init__(
            f"KV pool out of memory: requested {requested} page(s) of {page_size} token(s), "
            f"only {free} free"
        )
        self.requested = requested
        self.free = free


class InvalidPageError(RadixKVError, ValueError):
    """A page id was freed twice, never allocated, out of range, or is the reserved padding page."""


class CacheInvariantError(RadixKVError, AssertionError):
    """An internal invariant of the KV pool or radix cache does not hold (a bug, not user error)."""


class ModelLoadError(RadixKVError, ValueError):
    """A model cannot be loaded: missing file, unsupported architecture, bad or missing tensor.

    The message names the file and, where one is at fault, the tensor.
    """


class InvalidRequestError(RadixKVError, ValueError):
    """A request is malformed (bad sampling parameter, empty or too long prompt, bad token id).

    Raised before the request touches the scheduler; the message names the field at fault.
    """


class LoRAInUse(InvalidRequestError):
    """An adapter cannot be unloaded while requests run under it (HTTP 409)."""


class EngineError(RadixKVError, RuntimeError):
    """The engine cannot serve a call: it was shut down, or its scheduler stopped making progress."""


class FrontendError(RadixKVError):
    """A frontend-language program cannot go on: a misused primitive, or a failed backend call."""


class UnknownVariableError(FrontendError, KeyError):
    """A program read a variable no `gen`/`select` of its state (or its forks) has set."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0])


class BackendUnreachable(FrontendError):
    """The runtime a program talks to cannot be reached (no server at the URL, or it died)."""


class ServiceUnavailable(EngineError):
    """The runtime cannot serve now (a process died, or it is shutting down): try again later or
    elsewhere (HTTP 503)."""


class Overloaded(ServiceUnavailable):
    """The server holds as many requests as it takes (`--max-queued-requests`): retry later
    (HTTP 429)."""


class ErrorKind(enum.StrEnum):
    """Why a request ended without a result, as the core reports it. Each front maps a kind to
    its own terms: the Engine raises the error class below, the server answers an HTTP status
    (`radixkv.server.http.common.STATUS_OF`)."""

    INVALID_REQUEST = "invalid_request"  # the request is bad: fix it (InvalidRequestError)
    INTERNAL = "internal"  # the runtime failed on it (EngineError)
    UNAVAILABLE = "unavailable"  # the runtime cannot serve now (ServiceUnavailable)


_ERROR_OF_KIND = {ErrorKind.INVALID_REQUEST: InvalidRequestError, ErrorKind.INTERNAL: EngineError,
                  ErrorKind.UNAVAILABLE: ServiceUnavailable}


def error_of_kind(kind: str, message: str) -> RadixKVError:
    """The typed error for a request that ended with `kind` (an `ErrorKind` value)."""
    return _ERROR_OF_KIND.get(ErrorKind(kind), EngineError)(message)


def kind_of_error(e: BaseException) -> ErrorKind:
    """The `ErrorKind` a raised error reports to a request's caller."""
    if isinstance(e, ServiceUnavailable):
        return ErrorKind.UNAVAILABLE
    if isinstance(e, InvalidRequestError):
        return ErrorKind.INVALID_REQUEST
    return ErrorKind.INTERNAL


class TensorParallelError(EngineError):
    """A tensor-parallel rank failed to start or died: the message names the rank and why.

    The ranks compute every forward together, so after one is lost none can go on."""
