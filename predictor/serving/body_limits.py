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
from predictor.core.errors import BadInput, TooLarge, parse_param

DEFAULT_MAX_BODY_BYTES = 8 << 20
MAX_JSON_VALUES = 1 << 18
MAX_JSON_CONTAINERS = 100_000
MAX_JSON_DEPTH = DEFAULT_LIMITS.max_depth
DEFAULT_MAX_BATCH_ITEMS = 64
DEFAULT_MAX_QUEUE_WAIT_S = 10.0
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def json_counts(raw: bytes, exact: bool = False) -> tuple[int, int]:
    """(values, containers) of a JSON text, from its commas and brackets outside strings.

    Every value but a container's first child follows a comma, so the plain counts are an upper bound; strings
    are stripped (a CSV state is full of commas) when ``exact`` or when those counts exceed a limit, which makes
    them exact for compact JSON. Past the value limit the count may be a lower bound (the quotes'), still past it.
    """
    containers = raw.count(b"[") + raw.count(b"{")
    values = raw.count(b",") + containers + 1
    if not exact and values <= MAX_JSON_VALUES and containers <= MAX_JSON_CONTAINERS:
        return values, containers
    # Each string is a value or an object's key (never more keys than values): a quick lower bound from the
    # quotes, not escaped ones, refuses a body of a million short strings without stripping them.
    strings = (raw.count(b'"') - raw.count(b'\\"')) // 2
    if strings // 2 > MAX_JSON_VALUES:
        return strings // 2, containers
    unquoted = _JSON_STRING.sub(b"", raw)
    containers = unquoted.count(b"[") + unquoted.count(b"{")
    empty = unquoted.count(b"[]") + unquoted.count(b"{}")  # no first child
    return unquoted.count(b",") + containers - empty + 1, containers


def check_json_counts(raw: bytes, what: str = "the request body", param: str | None = None) -> None:
    """:class:`TooLarge` (413) when ``raw`` holds more than :data:`MAX_JSON_VALUES` values or
    :data:`MAX_JSON_CONTAINERS` arrays and objects."""
    _check_counts(*json_counts(raw), what, param)


def check_texts_json_counts(texts: list[bytes], param: str) -> None:
    """:class:`TooLarge` (413) naming ``param`` when JSON texts parsed one by one (KServe V2 elements) hold more
    values or containers together than one body may."""
    counts = [json_counts(text) for text in texts]
    if sum(values for values, _ in counts) > MAX_JSON_VALUES or sum(c for _, c in counts) > MAX_JSON_CONTAINERS:
        counts = [json_counts(text, exact=True) for text in texts]
    values, containers = sum(v for v, _ in counts), sum(c for _, c in counts)
    _check_counts(values, containers, "the input's data", param)


def _check_counts(values: int, containers: int, what: str, param: str | None) -> None:
    loc = parse_param(param) if param else ()
    if containers > MAX_JSON_CONTAINERS:
        raise TooLarge(
            f"{what} holds {containers} JSON arrays and objects, more than the limit of {MAX_JSON_CONTAINERS}",
            loc,
        )
    if values > MAX_JSON_VALUES:
        raise TooLarge(f"{what} holds {values} JSON values, more than the limit of {MAX_JSON_VALUES}", loc)


def check_item_count(count: int, max_items: int, param: str) -> None:
    """:class:`BadInput` (422) naming ``param`` when a body holds more than ``max_items`` System One requests."""
    if count > max_items:
        raise BadInput(
            f"holds {count} System One requests, more than the limit of {max_items} per body (--max-batch-items)",
            parse_param(param),
            "too_long",
        )
