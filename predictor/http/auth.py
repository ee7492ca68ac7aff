"""Optional API keys: ``Authorization: Bearer <key>`` on every route but health, metrics and readiness.

Keys come from ``--api-key-file`` (one key per line; blank lines and ``#`` comments skipped; read again
when the file changes, so a rotated Kubernetes Secret takes effect without a restart) and from the
``CLEF_API_KEYS`` environment variable (comma- or newline-separated). With no key configured, every
route is open. Keys are compared in constant time. The TypeSafe SDK sends ``api_key=`` as a Bearer token.
"""

from __future__ import annotations

import hmac
import logging
import re
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

from predictor.http.errors import AUTHENTICATION, HEADER, ApiError

log = logging.getLogger(__name__)

API_KEYS_ENV = "CLEF_API_KEYS"
#: How often (seconds) the key file's modification time is checked.
RELOAD_CHECK_S = 1.0
#: Paths answered without a key: liveness, readiness (Kubernetes probes carry no key; the health routes under the
#: ``/jev`` base too) and metrics.
OPEN_PATHS = re.compile(
    r"^(/|/metrics|(/jev)?(/health|/health/live|/v2/health/(live|ready))|/v2/models/[^/]+/ready|/v1/models/[^/:]+)$"
)
OPEN_METHODS = ("GET", "HEAD")


def parse_keys(text: str) -> list[bytes]:
    """Keys of a key file's or variable's text: one per line (or comma), blanks and ``#`` comments skipped."""
    keys = []
    for line in text.replace(",", "\n").splitlines():
        key = line.strip()
        if key and not key.startswith("#"):
            keys.append(key.encode())
    return keys


class ApiKeys:
    """The accepted keys: from the environment once, from the key file whenever it changes."""

    def __init__(self, key_file: Path | None, env_value: str | None) -> None:
        self.key_file = key_file
        self._env_keys = parse_keys(env_value or "")
        self._file_keys: list[bytes] = []
        self._stamp: tuple[float, int] | None = None
        self._checked = 0.0
        self._lock = threading.Lock()
        if key_file is not None:
            self._reload()

    @property
    def enabled(self) -> bool:
        """Whether requests need a key (a key file was given, or the variable holds keys)."""
        return self.key_file is not None or bool(self._env_keys)

    def _reload(self) -> None:
        assert self.key_file is not None
        try:
            stat = self.key_file.stat()
            stamp = (stat.st_mtime, stat.st_size)
            if stamp == self._stamp:
                return
            keys = parse_keys(self.key_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            if self._stamp != (0.0, -1):
                log.error("cannot read the API key file %s (%s): refusing every key it held", self.key_file, exc)
            self._file_keys, self._stamp = [], (0.0, -1)
            return
        if not keys:
            log.error("the API key file %s holds no key: only %s keys are accepted", self.key_file, API_KEYS_ENV)
        elif self._stamp is not None:
            log.info("API key file %s changed: %d key(s) loaded", self.key_file, len(keys))
        self._file_keys, self._stamp = keys, stamp

    def keys(self) -> list[bytes]:
        """The keys accepted now (the file is checked for changes at most once a second)."""
        if self.key_file is not None:
            now = time.monotonic()
            with self._lock:
                if now - self._checked >= RELOAD_CHECK_S:
                    self._checked = now
                    self._reload()
                return self._env_keys + self._file_keys
        return self._env_keys

    def accepts(self, presented: bytes) -> bool:
        """Whether ``presented`` is one of the keys; every key is compared, each in constant time."""
        matched = False
        for key in self.keys():
            matched |= hmac.compare_digest(presented, key)
        return matched


def bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header, if any."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return None
    return None


def unauthorized(message: str) -> ApiError:
    """A 401 in the API's error shape naming the ``Authorization`` header, with the challenge that names the scheme."""
    return ApiError(
        HTTPStatus.UNAUTHORIZED,
        AUTHENTICATION,
        message,
        "Authorization",
        headers={"WWW-Authenticate": "Bearer"},
        source=HEADER,
    )


class ApiKeyMiddleware:
    """Refuses requests without a valid key (401), except on :data:`OPEN_PATHS`."""

    def __init__(self, app: Callable[..., Any], keys: ApiKeys) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        """ASGI entry point."""
        if scope["type"] != "http" or (scope["method"] in OPEN_METHODS and OPEN_PATHS.match(scope["path"])):
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope["headers"])
        if token is None:
            error = unauthorized("an API key is required: send it as 'Authorization: Bearer <key>'")
        elif not self.keys.accepts(token):
            error = unauthorized("the API key is not valid")
        else:
            await self.app(scope, receive, send)
            return
        await error.response()(scope, receive, send)
