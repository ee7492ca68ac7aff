"""A client of the cluster's Services, run inside the real node's network namespace by ``python -m clef_cluster
exec`` (which resolves Service names through the client's own /etc/hosts): reads a JSON job on stdin, prints a JSON
result on stdout.

- ``{"mode": "http", "url": ..., "requests": [{"method", "path", "json" | "content", "headers"}]}``: each request
  in turn; ``[{"status", "headers", "body"}]``.
- ``{"mode": "sdk", "url": ..., "model": ...}``: one System One request by the TypeSafe SDK; the answer as JSON.
- ``{"mode": "load", "url": ..., "request": {...}, "clients": n, "seconds": s}``: ``n`` clients sending the request
  one after another for ``s`` seconds; each outcome as ``{"status", "retry_after"}`` or ``{"error": <class>,
  "sent": <whether the connection was made>}``, with ``at`` (seconds since the load began). Optional:
  ``"fresh": true`` sends each request on a new connection (``Connection: close``), so that the Service spreads
  them over its ready pods as new clients would be; ``"stop_file": path`` ends the load early once that file
  exists; ``"phases": [[clients, seconds], ...]`` (repeated until the end) keeps only that many of the ``n``
  clients sending in each phase; ``"unique": true`` makes each request's ``state`` unique (the request's state and
  a sequence number), so that none is answered from the predictor's answer cache; ``"backoff": true`` makes a
  client wait what an answer's ``Retry-After`` asks (at most 10 s) before its next request, as a polite client does.
  Every request carries its own ``x-request-id`` (``load-<client>-<n>``; the predictor logs it with ``--json-logs``):
  an answer that is neither 200 nor 429, and a connection broken after the request was sent, keep it as ``id``
  (with the answer's ``body`` and ``headers``), so that a failure names the pod's log line.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

BACKOFF_CAP_S = 10.0


def run_http(job: dict[str, Any]) -> list[dict[str, Any]]:
    results = []
    with httpx.Client(base_url=job["url"], timeout=120) as client:
        for request in job["requests"]:
            response = client.request(
                request.get("method", "POST"),
                request["path"],
                json=request.get("json"),
                content=request.get("content"),
                headers=request.get("headers"),
            )
            try:
                body: Any = response.json()
            except ValueError:
                body = response.text
            results.append({"status": response.status_code, "headers": dict(response.headers), "body": body})
    return results


def run_sdk(job: dict[str, Any]) -> dict[str, Any]:
    import typesafe_sdk

    with typesafe_sdk.TypeSafeClient(
        base_url=f"{job['url']}/jev", api_key=job.get("api_key", "unused"), model=job["model"], timeout=300
    ) as sdk:
        response = sdk.system_one(
            {"customer": {"message": "I was charged twice this month, please refund one payment.", "plan": "pro"}},
            {
                "urgent": typesafe_sdk.Noul(instructions="Does this need a reply today?"),
                "topic": typesafe_sdk.Choice(criteria={"billing": "Payments, refunds, invoices", "bug": None}),
                "tone": typesafe_sdk.Score(criteria=["calm", "annoyed", "angry"]),
            },
        )
    return {
        "model": response.model,
        "urgent": response.nouls["urgent"].noul,
        "topic": response.choices["topic"].choice,
        "tone": dict(response.scores["tone"].probabilities),
    }


def active_clients(phases: list[list[float]], elapsed: float) -> int:
    """How many clients send at ``elapsed`` seconds into a load of repeated ``[clients, seconds]`` phases."""
    elapsed %= sum(seconds for _, seconds in phases)
    for clients, seconds in phases:
        if elapsed < seconds:
            return int(clients)
        elapsed -= seconds
    return int(phases[-1][0])


def run_load(job: dict[str, Any]) -> list[dict[str, Any]]:
    outcomes: list[dict[str, Any]] = []
    lock = threading.Lock()
    started = time.monotonic()
    deadline = started + job["seconds"]
    headers = {"connection": "close"} if job.get("fresh") else {}
    stop_file = Path(job["stop_file"]) if job.get("stop_file") else None
    phases = job.get("phases") or [[job["clients"], job["seconds"]]]
    sequence = itertools.count()
    numbers = itertools.count()

    def body() -> dict[str, Any]:
        request: dict[str, Any] = job["request"]
        return (
            {**request, "state": {"load": next(sequence), "state": request["state"]}} if job.get("unique") else request
        )

    def running() -> bool:
        return time.monotonic() < deadline and not (stop_file is not None and stop_file.exists())

    def client_loop(index: int) -> None:
        with httpx.Client(base_url=job["url"], timeout=60, headers=headers) as client:
            while running():
                if index >= active_clients(phases, time.monotonic() - started):
                    time.sleep(0.1)
                    continue
                outcome: dict[str, Any]
                at = round(time.monotonic() - started, 2)
                request_id = f"load-{index}-{next(numbers)}"
                try:
                    response = client.post("/v1/systemone", json=body(), headers={"x-request-id": request_id})
                    outcome = {"status": response.status_code, "retry_after": response.headers.get("retry-after")}
                    if response.status_code not in (200, 429):
                        outcome.update(id=request_id, body=response.text[:2000], headers=dict(response.headers))
                    if job.get("backoff") and outcome["retry_after"]:
                        time.sleep(min(float(outcome["retry_after"]), BACKOFF_CAP_S))
                except httpx.ConnectError as error:  # refused or unreachable before a byte was sent
                    outcome = {"error": type(error).__name__, "sent": False}
                    time.sleep(0.2)
                except httpx.TransportError as error:  # the connection broke after the request was sent
                    outcome = {"error": type(error).__name__, "sent": True, "id": request_id, "detail": repr(error)}
                with lock:
                    outcomes.append({**outcome, "at": at})

    threads = [threading.Thread(target=client_loop, args=(index,)) for index in range(job["clients"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def main() -> None:
    job = json.load(sys.stdin)
    runners = {"http": run_http, "sdk": run_sdk, "load": run_load}
    json.dump(runners[job["mode"]](job), sys.stdout)


if __name__ == "__main__":
    main()
