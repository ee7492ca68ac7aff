"""Watch streams and a peering keep-alive that heal: the one place where the operator leans on kopf's internals.

kopf 1.45 (``kopf._cogs.clients.watching``) re-lists after a ``410 Gone`` ERROR event, but raises
``WatchingError`` for an ERROR event of any other status, and lets an API error escalate once
``settings.networking.error_backoffs`` are spent (an outage of about a minute). Either ends the watcher
task, and with it the whole operator. Kubernetes' own reflector treats every watch failure the same way:
back off, list again, watch from the new list. :func:`install` wraps kopf's ``continuous_watch`` (one
list-then-watch cycle) so that it does so too:

- a failed cycle (ERROR event of any status, 5xx or 429 after kopf's retries, connection reset or refused,
  timeout) is logged, followed by a capped exponential backoff per stream, then kopf lists again;
- objects that vanished while the stream was down get a DELETED event after the new list (the list has no
  tombstones), so kopf's indices and handlers forget them as they would have seen it live;
- every stream records when it last made progress (a list, an event, a new watch request), which the
  operator's liveness probe reads.

kopf's peering keep-alive (``kopf._core.engines.peering.keepalive``, one task per peering object) patches the
peering object through the same retrying request, and lets the error escalate once the retries are spent: the
task ends, and kopf's orchestrator ends the operator with it ("Multidimensional multitasker has failed") soon
after an outage of about a minute, with the watches already healed. No setting of kopf's changes that alone:
``settings.networking.error_backoffs`` is shared by every request kopf makes, and retries without end there would
keep a watch's list waiting inside kopf, out of sight of the healing above and of the liveness probe.
:func:`install` also wraps the keep-alive so that a failed one is logged and started again after the same capped
backoff, as a watch stream is; the keep-alive's own ``finally`` (kopf removing the peer's record) runs as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import aiohttp
import kopf
from kopf._cogs.clients import errors as kopf_errors
from kopf._cogs.clients import watching as kopf_watching
from kopf._cogs.structs.references import Namespace
from kopf._core.engines import peering as kopf_peering

LOGGER = logging.getLogger(__name__)
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 10.0
# A failed cycle is one of these: ERROR events, API errors kopf escalated after its retries, transport errors.
HEALABLE: tuple[type[BaseException], ...] = (
    kopf_watching.WatchingError,
    kopf_errors.APIServerError,
    kopf_errors.APITooManyRequestsError,
    kopf_errors.APIForbiddenError,  # kopf retries 403s too: an API server restarting may answer them briefly
    aiohttp.ClientError,
    OSError,
    TimeoutError,
)
_STATE_ATTRIBUTE = "clef_watch_streams"

_original_continuous_watch = kopf_watching.continuous_watch
_original_watch_objs = kopf_watching.watch_objs
_original_keepalive = kopf_peering.keepalive


@dataclass
class StreamHealth:
    """One resource's watch stream: what it last listed or saw, its failures in a row, its last progress."""

    known: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # last body by uid
    failures: int = 0
    progress: float = 0.0  # event-loop time

    def touch(self) -> None:
        self.progress = asyncio.get_running_loop().time()


def streams(settings: kopf.OperatorSettings) -> dict[tuple[str, str | None], StreamHealth]:
    """The streams of one running operator (kept on its settings object, which every watch call receives)."""
    found = getattr(settings, _STATE_ATTRIBUTE, None)
    if found is None:
        found = {}
        setattr(settings, _STATE_ATTRIBUTE, found)
    return found


def backoff(failures: int) -> float:
    """Seconds to wait after ``failures`` failed cycles in a row (0.5, 1, 2, 4, 8, 10, 10, ...)."""
    return min(BACKOFF_BASE_SECONDS * 2 ** min(failures, 16), BACKOFF_MAX_SECONDS)


def _uid(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return (meta or {}).get("uid") or None


async def continuous_watch(
    *, settings: kopf.OperatorSettings, resource: Any, namespace: Namespace, **kwargs: Any
) -> AsyncIterator[Any]:
    """kopf's list-then-watch cycle, ending quietly (after a backoff) on any failure, with DELETED catch-up."""
    stream = streams(settings).setdefault((str(resource), namespace), StreamHealth())
    stream.touch()
    listed: dict[str, Mapping[str, Any]] | None = {}
    try:
        async for item in _original_continuous_watch(
            settings=settings, resource=resource, namespace=namespace, **kwargs
        ):
            stream.touch()
            if item is kopf_watching.Bookmark.LISTED and listed is not None:
                for gone in stream.known.keys() - listed.keys():  # gone while the stream was down
                    yield {"type": "DELETED", "object": stream.known[gone]}
                stream.known, listed = listed, None
            elif isinstance(item, Mapping) and (uid := _uid(item.get("object"))) is not None:
                kind = item.get("type")
                if kind is None and listed is not None:
                    listed[uid] = item["object"]
                elif kind == "DELETED":
                    stream.known.pop(uid, None)
                elif kind in ("ADDED", "MODIFIED"):
                    stream.known[uid] = item["object"]
                    stream.failures = 0
            yield item
    except HEALABLE as exc:
        delay = backoff(stream.failures)
        stream.failures += 1
        where = f"in {namespace!r}" if namespace is not None else "cluster-wide"
        LOGGER.warning(
            "watch of %s %s failed (%s: %s); listing again in %.1f s", resource, where, type(exc).__name__, exc, delay
        )
        stream.touch()
        await asyncio.sleep(delay)
        stream.touch()


async def watch_objs(
    *, settings: kopf.OperatorSettings, resource: Any, namespace: Namespace, **kwargs: Any
) -> AsyncIterator[Any]:
    """kopf's single watch request, recording the (re)connection as progress of its stream."""
    streams(settings).setdefault((str(resource), namespace), StreamHealth()).touch()
    async for item in _original_watch_objs(settings=settings, resource=resource, namespace=namespace, **kwargs):
        yield item


async def keepalive(*, settings: kopf.OperatorSettings, **kwargs: Any) -> NoReturn:
    """kopf's peering keep-alive, started again after a capped backoff whenever an API failure ends it (the
    backoff starts over once a keep-alive has lasted a whole peering lifetime)."""
    loop = asyncio.get_running_loop()
    failures = 0
    while True:
        started = loop.time()
        try:
            await _original_keepalive(settings=settings, **kwargs)
        except HEALABLE as exc:
            if loop.time() - started > settings.peering.lifetime:
                failures = 0
            delay = backoff(failures)
            failures += 1
            LOGGER.warning(
                "peering keep-alive in %r failed (%s: %s); trying again in %.1f s",
                settings.peering.name,
                type(exc).__name__,
                exc,
                delay,
            )
            await asyncio.sleep(delay)


def stale_streams(settings: kopf.OperatorSettings, now: float, limit: float) -> list[str]:
    """The streams that made no progress (list, event, new watch request, retry) in the last ``limit`` s."""
    return [
        f"{resource}" + (f" in {namespace}" if namespace else "")
        for (resource, namespace), stream in streams(settings).items()
        if now - stream.progress > limit
    ]


def install() -> None:
    """Put the healing cycle and keep-alive in place of kopf's (idempotent)."""
    kopf_watching.continuous_watch = continuous_watch
    kopf_watching.watch_objs = watch_objs
    kopf_peering.keepalive = keepalive


def installed() -> bool:
    """Whether kopf's watch loop runs the healing cycle and its peering the healing keep-alive."""
    return (
        kopf_watching.continuous_watch is continuous_watch
        and kopf_watching.watch_objs is watch_objs
        and kopf_peering.keepalive is keepalive
    )
