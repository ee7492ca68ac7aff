"""Request bodies: a size limit (413), ``Content-Encoding`` (zstd, gzip; else 415) and JSON decoding.

The middleware runs in front of every route, KServe's included, so each route reads a plain, bounded body.
Decompressed bodies are bounded by the same limit (a small compressed body cannot expand without end).
A body must arrive within ``body_timeout`` seconds (408 otherwise: a slow sender cannot hold a request
open), decompression runs off the event loop, and KServe V2 binary and CloudEvent bodies are checked
before KServe decodes them (``predictor.http.kserve_inputs``).

A body's JSON values, arrays and objects are counted on the raw bytes before anything parses it
(:mod:`predictor.serving.body_limits`, where every body limit lives): past a limit, 413.
"""

from __future__ import annotations

import asyncio
import zlib
from http import HTTPStatus
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from predictor.core.errors import TooLarge
from predictor.http.errors import (
    HEADER,
    TIMEOUT,
    TOO_LARGE,
    UNSUPPORTED_MEDIA,
    ApiError,
    bad_request,
    from_service_error,
)
from predictor.http.kserve_inputs import kserve_body_error
from predictor.serving.body_limits import DEFAULT_MAX_BODY_BYTES, MAX_JSON_CONTAINERS, check_json_counts

try:  # Python 3.14+ ships zstd in the standard library.
    from compression.zstd import ZstdDecompressor, ZstdError  # type: ignore[import-not-found]
except ImportError:
    from backports.zstd import ZstdDecompressor, ZstdError

SUPPORTED_ENCODINGS = ("zstd", "gzip", "identity")


def _too_large(limit: int, what: str = "request body") -> ApiError:
    return ApiError(
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE, TOO_LARGE, f"the {what} is larger than the limit of {limit} bytes"
    )


def _decompress(name: str, decompressor: Any, errors: type[Exception], data: bytes, limit: int) -> bytes:
    """One ``name``-encoded body through ``decompressor``, refusing corrupt, truncated or oversized ones."""
    try:
        out = decompressor.decompress(data, max_length=limit + 1)
    except errors as exc:
        raise bad_request(f"the {name} request body is corrupt: {exc}") from None
    if len(out) > limit:
        raise _too_large(limit, "decompressed request body")
    if not decompressor.eof:
        raise bad_request(f"the {name} request body is truncated")
    return out


def decode_body(body: bytes, content_encoding: str, limit: int) -> bytes:
    """Undo ``Content-Encoding`` (a comma-separated list, applied in order) within ``limit`` bytes."""
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    for coding in codings:
        if coding not in SUPPORTED_ENCODINGS:
            raise ApiError(
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                UNSUPPORTED_MEDIA,
                f"Content-Encoding {coding!r} is not supported; use one of {', '.join(SUPPORTED_ENCODINGS)}",
                "Content-Encoding",
                source=HEADER,
            )
    for coding in reversed(codings):
        if coding == "gzip":
            body = _decompress("gzip", zlib.decompressobj(wbits=16 + zlib.MAX_WBITS), zlib.error, body, limit)
        elif coding == "zstd":
            body = _decompress("zstd", ZstdDecompressor(), ZstdError, body, limit)
    return body


class RequestBodyMiddleware:
    """Reads each request body once: rejects it past ``max_body_bytes`` and decompresses it."""

    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, body_timeout: float = 60.0) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        try:
            declared = headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
                raise _too_large(self.max_body_bytes)
            try:
                body = await asyncio.wait_for(self._read(receive), self.body_timeout)
            except TimeoutError:
                raise ApiError(
                    HTTPStatus.REQUEST_TIMEOUT,
                    TIMEOUT,
                    f"the request body did not arrive within {self.body_timeout:g} s",
                    headers={"Connection": "close"},
                ) from None
            encoding = headers.get("content-encoding", "")
            if encoding:
                body = await asyncio.to_thread(decode_body, body, encoding, self.max_body_bytes)
            if len(body) > MAX_JSON_CONTAINERS:
                await asyncio.to_thread(check_json_counts, body)
            kserve_error = kserve_body_error(scope["path"], headers, body)
            if kserve_error is not None:
                raise kserve_error
        except ApiError as error:
            await error.response()(scope, receive, send)
            return
        except TooLarge as error:
            await from_service_error(error).response()(scope, receive, send)
            return
        new_headers = [
            (key, value)
            for key, value in scope["headers"]
            if key.lower() not in (b"content-encoding", b"content-length")
        ]
        new_headers.append((b"content-length", str(len(body)).encode()))
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app({**scope, "headers": new_headers}, replay, send)

    async def _read(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _too_large(self.max_body_bytes)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)
