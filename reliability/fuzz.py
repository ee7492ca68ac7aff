"""Fuzz a running predictor: ``python -m reliability.fuzz --url http://127.0.0.1:8080 --requests 10000``.

Every route (System One, batch, the Jev mount, KServe V1/V2 JSON and binary, listings, health, closed and
unknown routes) gets mutated bodies, compressed bodies (gzip, zstd, bombs, corrupt, stacked), random
bytes, header abuse (oversized, many, malformed ``Content-Length``), slow and abandoned bodies, and raw
garbage on the socket. Bounded by ``--requests`` and ``--seconds``; loopback addresses only. A request
counts as a failure if it gets a 5xx or no answer within ``--request-timeout`` (a hang). Before and after,
a valid request is answered and the two answers must be identical. Exit status 1 on any failure.

One module of ~490 lines on purpose: the attacks are the :class:`Case` values :func:`make_case` draws, and all of
them share one sender, one verdict (5xx or hang) and one before/after answer check; a module per attack would
scatter a catalogue that is read as a whole.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gzip
import json
import random
import string
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from reliability.common import MODEL_NAME, loopback_url, valid_request

try:  # Python 3.14+ ships zstd in the standard library.
    from compression.zstd import compress as zstd_compress  # type: ignore[import-not-found]
except ImportError:
    from backports.zstd import compress as zstd_compress


@dataclass
class Case:
    """One fuzzed request: sent through httpx, or as raw bytes on a socket (``raw``)."""

    kind: str
    method: str = "POST"
    path: str = "/v1/systemone"
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    raw: bytes | None = None
    #: For raw cases: (bytes sent, then seconds to wait before sending the rest or closing).
    stall: float = 0.0
    rest: bytes | None = None


@dataclass
class Tally:
    """Outcomes by case kind and status."""

    statuses: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    sent: int = 0

    def add(self, case: Case, outcome: str) -> None:
        self.sent += 1
        self.statuses[outcome] += 1
        if outcome.startswith("5") or outcome == "hang":
            self.failures.append(f"{case.kind} {case.method} {case.path[:80]}: {outcome}")


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(9 if depth < 4 else 6)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False])
    if choice == 2:
        return rng.randint(-(2**40), 2**40)
    if choice == 3:
        return rng.uniform(-1e9, 1e9)
    if choice == 4:
        return "".join(rng.choice(string.printable + "é日🙂\u0000") for _ in range(rng.randrange(20)))
    if choice == 5:
        return ""
    if choice in (6, 7):
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {str(_random_json(rng, 4)): _random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _mutate(rng: random.Random, body: dict[str, Any]) -> Any:
    """A copy of ``body`` with one to three random changes."""
    body = json.loads(json.dumps(body))
    for _ in range(rng.randint(1, 3)):
        target: Any = body
        path = []
        while isinstance(target, (dict, list)) and target and rng.random() < 0.6:
            key = rng.choice(list(target)) if isinstance(target, dict) else rng.randrange(len(target))
            path.append(key)
            if not isinstance(target[key], (dict, list)):
                break
            target = target[key]
        if not isinstance(target, (dict, list)) or not target:
            continue
        key = rng.choice(list(target)) if isinstance(target, dict) else rng.randrange(len(target))
        action = rng.randrange(6)
        if action == 0 and isinstance(target, dict):
            del target[key]
        elif action == 1:
            target[key] = _random_json(rng)
        elif action == 2 and isinstance(target, dict):
            target[f"extra_{rng.randrange(100)}"] = _random_json(rng)
        elif action == 3:
            target[key] = "x" * rng.choice([0, 1, 300, 70_000])
        elif action == 4:
            target[key] = json.loads(_nested(rng.choice([10, 127, 129, 500])))
        else:
            target[key] = rng.choice([[], {}, -1, 10**6, "🙂" * 50])
    return body


@functools.cache
def _bomb(kind: str) -> bytes:
    """Small bodies that expand far (built once: compressing them is the fuzzer's cost, not the server's)."""
    if kind == "gzip-spaces":
        return gzip.compress(b" " * (64 << 20))
    if kind == "zstd-brackets":
        return zstd_compress(b"[" * (16 << 20))
    return zstd_compress(
        json.dumps(
            {"model": MODEL_NAME, "state": "9" * ((8 << 20) - 512), "questions": {"q": {"type": "noul"}}}
        ).encode()
    )


def _compressed(rng: random.Random, raw: bytes) -> tuple[bytes, str]:
    pick = rng.randrange(8)
    if pick == 0:
        return gzip.compress(raw), "gzip"
    if pick == 1:
        return zstd_compress(raw), "zstd"
    if pick == 2:
        return zstd_compress(gzip.compress(raw)), "gzip, zstd"
    if pick == 3:
        return _bomb("gzip-spaces"), "gzip"  # 64 MiB of spaces
    if pick == 4:
        return _bomb("zstd-brackets"), "zstd"
    if pick == 5:
        data = gzip.compress(raw)
        return data[: rng.randrange(1, len(data))], "gzip"  # truncated
    if pick == 6:
        return raw, rng.choice(["br", "deflate", "gzip", "zstd", "x-unknown", ",,", "identity, identity"])
    return _bomb("zstd-digits"), "zstd"  # 8 MiB of digits as the state


def _v2_binary(rng: random.Random, model: str) -> Case:
    item = json.dumps(valid_request(rng.randrange(100), model)).encode()
    element = len(item).to_bytes(4, "little") + item
    tensor: dict[str, Any] = {
        "name": "request",
        "datatype": rng.choice(["BYTES", "BYTES", "FP32", "NOPE"]),
        "shape": [1],
    }
    tensor["parameters"] = {"binary_data_size": rng.choice([len(element), 0, -1, len(element) + 7, "x"])}
    if rng.random() < 0.2:
        del tensor["shape"]
    header = json.dumps(rng.choice([{"inputs": [tensor]}, [], {"inputs": []}, {"inputs": [tensor, tensor]}])).encode()
    length = rng.choice([str(len(header))] * 3 + ["abc", "-1", "999999", "", " 5"])
    return Case(
        "v2-binary",
        path=f"/v2/models/{model}/infer",
        headers={"inference-header-content-length": length, "content-type": "application/octet-stream"},
        body=header + element,
    )


ROUTES = ["/v1/systemone", "/jev/v1/systemone", "/v1/systemone/batch", "/jev/v1/systemone/batch"]
OTHER_PATHS = [
    ("GET", "/health"),
    ("GET", "/health/live"),
    ("GET", "/metrics"),
    ("GET", "/"),
    ("GET", "/v1/models"),
    ("GET", "/jev/v1/models"),
    ("GET", "/v2"),
    ("GET", "/v2/models"),
    ("GET", "/v2/health/ready"),
    ("POST", "/v2/repository/models/{m}/unload"),
    ("POST", "/v2/repository/models/{m}/load"),
    ("POST", "/v2/repository/index"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/redoc"),
    ("POST", "/v2/models/{m}/versions/1/infer"),
    ("GET", "/v2/models/{m}/versions/1"),
    ("POST", "/v1/models/{m}:explain"),
    ("GET", "/v1/models/{m}"),
    ("GET", "/v2/models/{m}"),
    ("GET", "/v2/models/{m}/ready"),
    ("PUT", "/v1/systemone"),
    ("DELETE", "/v1/systemone"),
    ("PATCH", "/v2/models/{m}/infer"),
    ("GET", "/v1/systemone"),
    ("OPTIONS", "/v1/systemone"),
    ("GET", "/v1/models/" + "n" * 5000),
    ("POST", "/v2/models/" + "%00" * 10 + "/infer"),
    ("GET", "/../../etc/passwd"),
]


def make_case(rng: random.Random, model: str) -> Case:
    """One random case."""
    kind = rng.choices(
        [
            "mutated",
            "batch",
            "v1",
            "v2-json",
            "v2-binary",
            "compressed",
            "bytes",
            "paths",
            "headers",
            "slow",
            "garbage",
        ],
        weights=[22, 8, 8, 8, 6, 10, 6, 10, 8, 6, 8],
    )[0]
    valid = valid_request(rng.randrange(1000), model)
    if kind == "mutated":
        return Case(
            kind,
            path=rng.choice(ROUTES[:2]),
            headers={"content-type": "application/json"},
            body=json.dumps(_mutate(rng, valid)).encode(),
        )
    if kind == "batch":
        items = [rng.choice([valid, _mutate(rng, valid), _random_json(rng)]) for _ in range(rng.choice([0, 1, 3, 70]))]
        body = rng.choice([items, {"requests": items}, _random_json(rng)])
        return Case(
            kind,
            path=rng.choice(ROUTES[2:]),
            headers={"content-type": "application/json"},
            body=json.dumps(body).encode(),
        )
    if kind == "v1":
        body = rng.choice(
            [
                {"instances": [valid, _mutate(rng, valid)]},
                {"instances": _random_json(rng)},
                _mutate(rng, {"instances": [valid]}),
                _random_json(rng),
            ]
        )
        headers = {"content-type": "application/json"}
        if rng.random() < 0.3:
            headers.update(
                {"ce-specversion": "1.0", "ce-source": "fuzz", "ce-type": "t", "ce-id": str(rng.randrange(9))}
            )
            headers["content-type"] = rng.choice(["application/json", "application/cloudevents+json", "text/plain"])
            if rng.random() < 0.5:
                return Case(
                    "v1-cloudevent",
                    path=f"/v1/models/{model}:predict",
                    headers=headers,
                    body=rng.choice([b"{", b"", b"[]", b"\xff"]),
                )
        return Case(kind, path=f"/v1/models/{model}:predict", headers=headers, body=json.dumps(body).encode())
    if kind == "v2-json":
        tensor = {"name": "request", "datatype": "BYTES", "shape": [1], "data": [json.dumps(_mutate(rng, valid))]}
        body = (
            _mutate(rng, {"inputs": [tensor]})
            if rng.random() < 0.7
            else rng.choice([[], {"inputs": "x"}, _random_json(rng)])
        )
        return Case(
            kind,
            path=f"/v2/models/{model}/infer",
            headers={"content-type": "application/json"},
            body=json.dumps(body).encode(),
        )
    if kind == "v2-binary":
        return _v2_binary(rng, model)
    if kind == "compressed":
        data, encoding = _compressed(rng, json.dumps(rng.choice([valid, _mutate(rng, valid)])).encode())
        return Case(
            kind,
            path=rng.choice(ROUTES[:2] + [f"/v1/models/{model}:predict"]),
            headers={"content-type": "application/json", "content-encoding": encoding},
            body=data,
        )
    if kind == "bytes":
        data = rng.randbytes(rng.choice([0, 1, 100, 5000]))
        content_type = rng.choice(
            ["application/json", "multipart/form-data; boundary=x", "text/plain", "application/octet-stream", ""]
        )
        path = rng.choice(ROUTES + [f"/v1/models/{model}:predict", f"/v2/models/{model}/infer"])
        return Case(kind, path=path, headers={"content-type": content_type} if content_type else {}, body=data)
    if kind == "paths":
        method, path = rng.choice(OTHER_PATHS)
        return Case(
            kind,
            method=method,
            path=path.replace("{m}", rng.choice([model, "nope", "x" * 300])),
            body=json.dumps(valid).encode() if method in ("POST", "PUT", "PATCH") else None,
        )
    if kind == "headers":
        return _header_abuse(rng, model)
    if kind == "slow":
        body = json.dumps(valid).encode()
        cut = rng.randrange(1, len(body))
        head = (
            "POST /v1/systemone HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        if rng.random() < 0.5:  # slow but complete
            return Case("slow-body", raw=head + body[:cut], stall=rng.uniform(0.1, 1.5), rest=body[cut:])
        return Case("abandoned-body", raw=head + body[:cut], stall=rng.uniform(0.1, 1.0), rest=None)
    garbage = rng.choice(
        [
            b"GARBAGE\r\n\r\n",
            b"GET / HTTP/9.9\r\n\r\n",
            b"\x16\x03\x01\x00\xa5\x01\x00\x00",
            rng.randbytes(200),
            b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n12345",
            b"GET /health HTTP/1.1\r\nHost: x\r\n",  # headers never finished
        ]
    )
    return Case("garbage", raw=garbage, stall=rng.uniform(0.0, 0.5))


def _header_abuse(rng: random.Random, model: str) -> Case:
    body = json.dumps(valid_request(1, model)).encode()
    pick = rng.randrange(5)
    start = b"POST /v1/systemone HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/json\r\n"
    if pick == 0:
        headers = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 100) for i in range(rng.choice([50, 2000])))
        return Case("many-headers", raw=start + headers + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    if pick == 1:
        return Case(
            "huge-header",
            raw=start
            + b"X-Big: "
            + b"b" * rng.choice([8000, 200_000])
            + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body,
        )
    if pick == 2:
        length = rng.choice([b"abc", b"-5", b"99999999999999999999", b"1e3", b""])
        return Case("bad-content-length", raw=start + b"Content-Length: " + length + b"\r\n\r\n" + body)
    if pick == 3:
        return Case("short-content-length", raw=start + b"Content-Length: 10\r\n\r\n" + body)
    return Case(
        "auth-and-ids",
        headers={
            "authorization": rng.choice(["Bearer", "Bearer " + "k" * 5000, "Basic x", ""]),
            "x-request-id": rng.choice(["a" * 10_000, "\x01", "ok-1"]),
            "content-type": "application/json",
        },
        body=body,
    )


async def send_raw(host: str, port: int, case: Case, timeout: float) -> str:
    """Send a raw case; the outcome is the status code, ``closed`` (server hung up first) or ``hang``."""
    assert case.raw is not None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (TimeoutError, OSError):
        return "connect-failed"
    try:
        writer.write(case.raw)
        await writer.drain()
        if case.stall:
            await asyncio.sleep(case.stall)
            if case.rest is None and case.kind == "abandoned-body":
                return "abandoned"
            if case.rest:
                writer.write(case.rest)
                await writer.drain()
        if case.kind == "garbage" and case.raw.endswith(b"Host: x\r\n"):
            return "abandoned"
        line = await asyncio.wait_for(reader.readline(), timeout)
        if not line:
            return "closed"
        parts = line.split()
        return parts[1].decode() if len(parts) > 1 and parts[1].isdigit() else "bad-status-line"
    except TimeoutError:
        return "hang"
    except (ConnectionError, OSError):
        return "closed"
    finally:
        writer.close()


async def send(client: httpx.AsyncClient, host: str, port: int, case: Case, timeout: float) -> str:
    """Send one case; the outcome as a string (status code, ``closed``, ``hang`` ...)."""
    if case.raw is not None:
        return await send_raw(host, port, case, timeout)
    try:
        response = await client.request(
            case.method, case.path, content=case.body, headers=case.headers, timeout=timeout
        )
    except httpx.TimeoutException:
        return "hang"
    except httpx.TransportError:
        return "closed"
    return str(response.status_code)


async def answer(url: str, headers: dict[str, str], model: str) -> dict[str, Any]:
    """The answer to one fixed valid request, on a connection of its own: a pooled one that the fuzz left idle may
    be closed by the server's keep-alive timeout just as the request goes out (a client-side race, not a failure)."""
    async with httpx.AsyncClient(base_url=url, headers=headers) as client:
        response = await client.post("/v1/systemone", json=valid_request(7, model), timeout=300)
    response.raise_for_status()
    return response.json()


async def fuzz(
    url: str,
    requests: int,
    seconds: float,
    concurrency: int,
    request_timeout: float,
    seed: int,
    model: str,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the fuzz; return its figures (``ok`` is False on any 5xx, hang or changed answer)."""
    url = loopback_url(url)
    parsed = httpx.URL(url)
    host, port = parsed.host, parsed.port or 80
    rng = random.Random(seed)
    tally = Tally()
    started = time.monotonic()
    before = await answer(url, headers or {}, model)
    async with httpx.AsyncClient(
        base_url=url, headers=headers or {}, limits=httpx.Limits(max_connections=concurrency)
    ) as client:
        next_index = 0

        async def worker() -> None:
            nonlocal next_index
            while next_index < requests and time.monotonic() - started < seconds:
                next_index += 1
                case = make_case(rng, model)
                tally.add(case, await send(client, host, port, case, request_timeout))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    after = await answer(url, headers or {}, model)
    return {
        "requests": tally.sent,
        "seconds": round(time.monotonic() - started, 1),
        "outcomes": dict(sorted(tally.statuses.items())),
        "failures": tally.failures[:50],
        "failure_count": len(tally.failures),
        "same_answer_after": before == after,
        "ok": not tally.failures and before == after,
    }


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m reliability.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="predictor base URL (loopback only)")
    parser.add_argument("--requests", type=int, default=10_000, help="fuzzed requests to send")
    parser.add_argument("--seconds", type=float, default=1800, help="stop after this long whatever the count")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--request-timeout", type=float, default=120, help="no answer within this: a hang")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=MODEL_NAME)
    parser.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer' (a server with keys)")
    args = parser.parse_args(argv)
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else None
    result = asyncio.run(
        fuzz(
            args.url,
            args.requests,
            args.seconds,
            args.concurrency,
            args.request_timeout,
            args.seed,
            args.model,
            headers,
        )
    )
    print(json.dumps(result, indent=2))
    raise SystemExit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
