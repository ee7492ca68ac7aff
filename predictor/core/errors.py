"""What the System One service can fail with, as domain errors, and the field paths they name.

Nothing here knows HTTP: :func:`predictor.http.errors.from_service_error` is the one place that maps each
error to a status code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Location = tuple[int | str, ...]
MAX_QUOTED_CHARS = 64


def format_param(location: Sequence[int | str]) -> str:
    """A field path such as ``inputs[0].shape`` from a location like ``("inputs", 0, "shape")``."""
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def parse_param(param: str) -> Location:
    """The location of a path written by :func:`format_param`
    (``instances[2].model`` → ``("instances", 2, "model")``)."""
    parts: list[int | str] = []
    for dotted in param.split(".") if param else ():
        name, _, rest = dotted.partition("[")
        if name:
            parts.append(name)
        for index in rest.rstrip("]").split("][") if rest else ():
            parts.append(int(index) if index.isdigit() else index)
    return tuple(parts)


def quoted(name: str) -> str:
    """``name`` in quotes, cut to :data:`MAX_QUOTED_CHARS` characters (an error must not echo a huge name)."""
    if len(name) > MAX_QUOTED_CHARS:
        return repr(name[:MAX_QUOTED_CHARS]) + f"... ({len(name)} characters)"
    return repr(name)


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


class Unreadable(ServiceError):
    """The body cannot be read at all (not JSON, empty, multipart); ``loc`` names a field when one is to blame."""


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
