"""The limits every request body meets, whatever route or transport brings it, and their checks.

One place for them so that every entry point (HTTP routes, KServe V1/V2, gRPC) applies the same ones:

- ``DEFAULT_MAX_BODY_BYTES`` (``--max-body-bytes``): bytes on the wire, and again after ``Content-Encoding``
  is undone (a small compressed body cannot inflate past it);
- ``MAX_JSON_VALUES``: JSON values (scalars, arrays, objects) in one body, all items together;
- ``MAX_JSON_CONTAINERS``: arrays and objects among them (each costs more to build than a scalar);
- ``MAX_JSON_DEPTH``: nesting (:class:`clef_head.request.RequestLimits`, checked by ``parse_request``);
- ``DEFAULT_MAX_BATCH_ITEMS`` (``--max-batch-items``): System One requests in one body: the batch route's
  array, KServe V1 ``instances`` and V2 ``inputs[0].data`` alike; admission counts each as one record;
- ``DEFAULT_MAX_QUEUE_WAIT_S`` (``--max-queue-wait-s``): the expected wait beyond which admission sheds.

Values are counted on the raw bytes, before anything parses them: commas and brackets outside JSON strings
bound the values a text holds. A few KB of gzip can inflate to a million short strings or empty lists, and
building that many Python objects holds the interpreter for seconds, whatever thread does it. A body past a
count limit gets 413 naming the limit; too many items get 422 naming the field and the flag.
"""

from __future__ import annotations

import re

from clef_head.request import DEFAULT_LIMITS
from predictor.errors import parse_param
from predictor.service_errors import BadInput, TooLarge

DEFAULT_MAX_BODY_BYTES = 8 << 20
MAX_JSON_VALUES = 1 << 18
MAX_JSON_CONTAINERS = 100_000
MAX_JSON_DEPTH = DEFAULT_LIMITS.max_depth
DEFAULT_MAX_BATCH_ITEMS = 64
DEFAULT_MAX_QUEUE_WAIT_S = 10.0
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def json_counts(raw: bytes) -> tuple[int, int]:
    """(values, containers) of a JSON text, from its commas and brackets outside strings.

    Exact for valid JSON (every value but a container's first follows a comma), or an upper bound; strings are
    stripped only when the plain counts exceed a limit (a CSV state is full of commas). Past the value limit the
    count returned may be a lower bound (the quotes'), still past the limit.
    """
    containers = raw.count(b"[") + raw.count(b"{")
    values = raw.count(b",") + containers + 1
    if values <= MAX_JSON_VALUES and containers <= MAX_JSON_CONTAINERS:
        return values, containers
    # Each string is a value or an object's key (never more keys than values): a quick lower bound from the
    # quotes, not escaped ones, refuses a body of a million short strings without stripping them.
    strings = (raw.count(b'"') - raw.count(b'\\"')) // 2
    if strings // 2 > MAX_JSON_VALUES:
        return strings // 2, containers
    unquoted = _JSON_STRING.sub(b"", raw)
    containers = unquoted.count(b"[") + unquoted.count(b"{")
    return unquoted.count(b",") + containers + 1, containers


def check_json_counts(raw: bytes, what: str = "the request body", param: str | None = None) -> int:
    """The values of ``raw``; :class:`TooLarge` (413) past :data:`MAX_JSON_VALUES` values or
    :data:`MAX_JSON_CONTAINERS` arrays and objects."""
    if len(raw) <= min(MAX_JSON_VALUES, MAX_JSON_CONTAINERS):  # every value takes at least one byte
        return len(raw)
    values, containers = json_counts(raw)
    loc = parse_param(param) if param else ()
    if containers > MAX_JSON_CONTAINERS:
        raise TooLarge(
            f"{what} holds {containers} JSON arrays and objects, more than the limit of {MAX_JSON_CONTAINERS}", loc
        )
    if values > MAX_JSON_VALUES:
        raise TooLarge(f"{what} holds {values} JSON values, more than the limit of {MAX_JSON_VALUES}", loc)
    return values


def check_item_count(count: int, max_items: int, param: str) -> None:
    """:class:`BadInput` (422) naming ``param`` when a body holds more than ``max_items`` System One requests."""
    if count > max_items:
        raise BadInput(
            f"holds {count} System One requests, more than the limit of {max_items} per body (--max-batch-items)",
            parse_param(param),
            "too_long",
        )
