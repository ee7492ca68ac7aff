"""What the System One service can fail with, as domain errors; the HTTP layer maps them to statuses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Location = tuple[int | str, ...]


def rebuild_error(cls: type[Exception], args: tuple[Any, ...], state: dict[str, Any]) -> Exception:
    """An exception of ``cls`` with ``args`` and attributes ``state``, without calling its ``__init__``."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class PicklableError(Exception):
    """An exception that pickles with every attribute whatever its ``__init__`` takes (errors raised in an
    encode worker process reach the HTTP layer unchanged)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return rebuild_error, (type(self), self.args, dict(self.__dict__))


class ServiceError(PicklableError):
    """A request the service did not answer; ``loc`` is the offending field's path (empty: the whole request)."""

    def __init__(self, message: str, loc: Sequence[int | str] = (), kind: str = "value_error") -> None:
        self.loc: Location = tuple(loc)
        self.message = message
        self.kind = kind
        where = ".".join(map(str, self.loc))
        super().__init__(f"{where}: {message}" if where else message)


class BadInput(ServiceError):
    """A field of the request breaks a rule (the message and ``loc`` say which and how)."""


class ModelNotServed(ServiceError):
    """The request names a model this server does not serve."""


class TooLarge(ServiceError):
    """The request cannot fit the engine (a state over the prompt's room when over-long states are refused)."""


class Unavailable(ServiceError):
    """The service cannot take the request now; retrying after ``retry_after`` seconds may succeed.

    ``reason``: ``warming_up``, ``draining``, ``engine_dead``, ``overloaded`` or ``encoder_died``.
    """

    def __init__(self, message: str, reason: str, retry_after: int) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class EngineFailed(ServiceError):
    """The engine failed on this request while staying alive (a bug, not a bad request)."""
