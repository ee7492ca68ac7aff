"""A ``multipart/form-data`` System One body, as the TypeSafe SDK sends images (RFC 7578).

The JSON request is the part named ``request``; every other part holds one image's file bytes and is named
by an asset's ``part``. The body is already in memory (bounded by ``--max-body-bytes``); the parts are
counted before they are split, so a body of thousands of tiny parts is refused at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from predictor.core.errors import BadInput, Unreadable

REQUEST_PART = "request"
_BOUNDARY = re.compile(r'boundary="?([^";]{1,70})"?', re.IGNORECASE)
_NAME = re.compile(rb'(?:^|;)\s*name="([^"]*)"', re.IGNORECASE)


@dataclass(frozen=True)
class MultipartBody:
    """The JSON text of the ``request`` part and the other parts' bytes by name."""

    request: bytes
    parts: dict[str, bytes]


def is_multipart(content_type: str) -> bool:
    """Whether a Content-Type is ``multipart/...``."""
    return content_type.split(";")[0].strip().lower().startswith("multipart/")


def read_multipart(raw: bytes, content_type: str, max_parts: int) -> MultipartBody:
    """The parts of a ``multipart/form-data`` body: :class:`Unreadable` when it is malformed, :class:`BadInput`
    (at ``assets``) when it has more than ``max_parts`` image parts."""
    if content_type.split(";")[0].strip().lower() != "multipart/form-data":
        raise Unreadable("a multipart body must be multipart/form-data")
    found = _BOUNDARY.search(content_type)
    if found is None:
        raise Unreadable("the multipart Content-Type has no boundary")
    delimiter = b"--" + found[1].encode("latin-1")
    if raw.count(delimiter) - 2 > max_parts:  # the request part and the closing delimiter are not images
        raise BadInput(
            f"the body has more than {max_parts} image parts; at most {max_parts} images are allowed per request",
            ("assets",),
            "too_many_images",
        )
    head, separator, rest = raw.partition(delimiter)
    end = rest.find(b"\r\n" + delimiter + b"--")
    if not separator or end < 0:
        raise Unreadable("the multipart body is malformed: no opening or closing boundary")
    parts: dict[str, bytes] = {}
    for chunk in rest[:end].split(b"\r\n" + delimiter):
        headers, blank, content = chunk.partition(b"\r\n\r\n")
        if not blank or not headers.startswith(b"\r\n"):
            raise Unreadable("the multipart body is malformed: a part has no headers")
        name = _part_name(headers)
        if name in parts:
            raise Unreadable(f"the multipart body has two parts named {name!r}")
        parts[name] = content
    request = parts.pop(REQUEST_PART, None)
    if request is None:
        raise Unreadable(f"the multipart body has no part named {REQUEST_PART!r} (the JSON request)")
    return MultipartBody(request, parts)


def _part_name(headers: bytes) -> str:
    for line in headers.split(b"\r\n"):
        field, _, value = line.partition(b":")
        if field.strip().lower() == b"content-disposition":
            found = _NAME.search(value)
            if found is not None:
                return found[1].decode("utf-8", "replace")
    raise Unreadable("the multipart body is malformed: a part has no Content-Disposition name")
