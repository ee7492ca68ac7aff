"""Checks of KServe bodies that KServe's own decoder answers with 500, made before it decodes them.

A binary V2 body is a JSON header of ``inference-header-content-length`` bytes followed by the inputs'
raw bytes, each input declaring its size in ``parameters.binary_data_size``. Every rule KServe's decoder
assumes is checked here and broken ones get a 400 naming the header or field. A V1 request with
CloudEvent (``ce-*``) headers is read as a CloudEvent first, as KServe will: a failure is a 400.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import orjson
from cloudevents.http import from_http

from predictor.http.errors import HEADER, ApiError, bad_request

HEADER_LENGTH = "inference-header-content-length"
#: Bytes per element of the fixed-size V2 datatypes (BYTES elements carry their own 4-byte lengths).
ITEM_BYTES = {
    "BOOL": 1,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FP16": 2,
    "FP32": 4,
    "FP64": 8,
}
#: Elements one input may declare (its shape's product).
MAX_ELEMENTS = 1 << 20


def check_v2_binary_body(body: bytes, header_value: str) -> None:
    """Raise a 400 :class:`ApiError` unless ``body`` is a well-formed V2 binary-extension body."""
    if not header_value.strip().isdigit():
        raise bad_request(f"the {HEADER_LENGTH} header must be a non-negative integer", HEADER_LENGTH, HEADER)
    json_length = int(header_value)
    if json_length > len(body):
        raise bad_request(
            f"the {HEADER_LENGTH} header says {json_length} bytes but the body has {len(body)}", HEADER_LENGTH, HEADER
        )
    try:
        header = orjson.loads(body[:json_length])
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the JSON header ({HEADER_LENGTH} bytes) is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise bad_request("the JSON header must be an object with an 'inputs' list")
    inputs = header.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise bad_request("must be a non-empty list", "inputs")
    offset = json_length
    for index, tensor in enumerate(inputs):
        offset = _check_input(tensor, index, body, offset)
    if offset != len(body):
        raise bad_request(
            f"the inputs' binary_data_size add up to {offset - json_length} bytes but {len(body) - json_length} "
            "follow the JSON header",
            "inputs",
        )


def _check_input(tensor: Any, index: int, body: bytes, offset: int) -> int:
    """Check one input; return the offset after its binary data."""
    where = f"inputs[{index}]"
    if not isinstance(tensor, dict):
        raise bad_request("must be an object", where)
    for field in ("name", "datatype"):
        if not isinstance(tensor.get(field), str):
            raise bad_request("is required and must be a string", f"{where}.{field}")
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise bad_request("is required and must be a list of non-negative integers", f"{where}.shape")
    elements = math.prod(shape)
    if elements > MAX_ELEMENTS:
        raise bad_request(f"declares {elements} elements, more than {MAX_ELEMENTS}", f"{where}.shape")
    parameters = tensor.get("parameters")
    if parameters is None or "binary_data_size" not in (parameters if isinstance(parameters, dict) else {}):
        if "data" not in tensor:
            raise bad_request("give either 'data' or parameters.binary_data_size", where)
        return offset
    size = parameters["binary_data_size"]
    param = f"{where}.parameters.binary_data_size"
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise bad_request("must be a non-negative integer", param)
    if offset + size > len(body):
        raise bad_request(f"is {size} bytes but only {len(body) - offset} remain in the body", param)
    datatype = tensor["datatype"]
    if datatype == "BYTES":
        count = _bytes_elements(body[offset : offset + size], param)
        if count != elements:
            raise bad_request(f"holds {count} BYTES elements but the shape {shape} needs {elements}", param)
    elif datatype in ITEM_BYTES:
        if size != elements * ITEM_BYTES[datatype]:
            raise bad_request(
                f"is {size} bytes but the shape {shape} of {datatype} needs {elements * ITEM_BYTES[datatype]}", param
            )
    else:
        raise bad_request(f"{datatype!r} is not a V2 datatype", f"{where}.datatype")
    return offset + size


def _bytes_elements(data: bytes, param: str) -> int:
    """Number of length-prefixed elements in a BYTES input's binary data; 400 if a length overruns it."""
    count, position = 0, 0
    while position < len(data):
        if position + 4 > len(data):
            raise bad_request("ends inside an element's 4-byte length", param)
        (length,) = struct.unpack_from("<I", data, position)
        position += 4 + length
        if position > len(data):
            raise bad_request("an element's length runs past the input's binary data", param)
        count += 1
        if count > MAX_ELEMENTS:
            raise bad_request(f"holds more than {MAX_ELEMENTS} elements", param)
    return count


def v2_binary_error(path: str, headers: dict[str, str], body: bytes) -> ApiError | None:
    """The 400 for a malformed V2 binary body on a V2 infer path, or None."""
    if not path.startswith("/v2/models/") or not path.endswith("/infer") or HEADER_LENGTH not in headers:
        return None
    try:
        check_v2_binary_body(body, headers[HEADER_LENGTH])
    except ApiError as error:
        return error
    return None


def cloudevent_error(path: str, headers: dict[str, str], body: bytes) -> ApiError | None:
    """The 400 for a V1 request whose CloudEvent headers and body KServe could not read, or None."""
    if not path.startswith("/v1/models/") or not any(name.startswith("ce-") for name in headers):
        return None
    try:
        event = from_http(headers, body, None if "ce-contenttype" in headers else lambda data: data)
    except Exception as exc:  # noqa: BLE001 (cloudevents raises many types, each an unreadable event: a 400)
        return bad_request(f"the CloudEvent cannot be read: {type(exc).__name__}: {str(exc)[:200]}")
    if not isinstance(event.get_data(), (bytes, bytearray)) or not event.get_data():
        return bad_request("the CloudEvent has no data: send the V1 request (a JSON object) as its body")
    return None


def kserve_body_error(path: str, headers: dict[str, str], body: bytes) -> ApiError | None:
    """The 400 for a KServe body its decoder would fail on with a 500, or None."""
    return v2_binary_error(path, headers, body) or cloudevent_error(path, headers, body)
