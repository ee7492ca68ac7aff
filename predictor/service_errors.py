"""What the System One service can fail with, as domain errors; the HTTP layer maps them to statuses."""

from __future__ import annotations


class ServiceError(Exception):
    """A request the service did not answer; ``param`` names the offending field, if any."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.message = message
        self.param = param or None


class BadInput(ServiceError):
    """The request is invalid (the message and ``param`` say where)."""


class ModelNotServed(ServiceError):
    """The request names a model this server does not serve."""


class Unavailable(ServiceError):
    """The service cannot take the request now; retrying after ``retry_after`` seconds may succeed.

    ``reason``: ``warming_up``, ``draining``, ``engine_dead`` or ``overloaded``.
    """

    def __init__(self, message: str, reason: str, retry_after: int) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class EngineFailed(ServiceError):
    """The engine failed on this request while staying alive (a bug, not a bad request)."""
