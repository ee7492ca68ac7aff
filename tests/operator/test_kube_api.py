"""How the operator's API calls read the API server's refusals, through the official client over HTTP (a local
listener answers as kube-apiserver does)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes
import pytest

from clef_operator.constants import DECISION_LABEL
from clef_operator.kube import ApiError, ConflictError, KubeApi
from clef_operator.resources import DEPLOYMENTS, INFERENCESERVICES

#: kube-apiserver's answer to a create in a namespace that has just been deleted.
NAMESPACE_GONE = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'namespaces "life-nsdel" not found',
    "reason": "NotFound",
    "details": {"name": "life-nsdel", "kind": "namespaces"},
    "code": 404,
}
NAME_TAKEN = {**NAMESPACE_GONE, "message": 'inferenceservices "clef-a" already exists', "reason": "AlreadyExists"}


class Answers:
    """The status and Status body every POST gets, and the body every GET gets."""

    def __init__(self) -> None:
        self.status = 404
        self.body: dict[str, Any] = NAMESPACE_GONE
        self.listed: dict[str, Any] = {"kind": "DeploymentList", "apiVersion": "apps/v1", "items": []}


@pytest.fixture
def api() -> Iterator[tuple[KubeApi, Answers]]:
    answers = Answers()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self._answer(answers.status, answers.body)

        def do_GET(self) -> None:
            self._answer(200, answers.listed)

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield KubeApi(configuration), answers
    finally:
        server.shutdown()
        server.server_close()


def _isvc(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"namespace": namespace, "name": "clef-a"},
    }


async def test_a_create_in_a_deleted_namespace_is_an_api_error_naming_it(api: tuple[KubeApi, Answers]) -> None:
    """A ClefDecision's namespace deleted during its pass: the refusal is an ApiError (the pass reports it and
    retries; the next finds the ClefDecision gone), not an uncaught error with a traceback in the log."""
    kube, _ = api
    with pytest.raises(ApiError) as refused:
        await kube.create(INFERENCESERVICES, _isvc("life-nsdel"))
    assert refused.value.code == 404 and 'namespaces "life-nsdel" not found' in str(refused.value)


async def test_a_taken_name_is_a_conflict(api: tuple[KubeApi, Answers]) -> None:
    kube, answers = api
    answers.status, answers.body = 409, NAME_TAKEN
    with pytest.raises(ConflictError):
        await kube.create(INFERENCESERVICES, _isvc("serving"))


async def test_a_listing_that_ignored_the_label_selector_yields_only_labelled_objects(
    api: tuple[KubeApi, Answers],
) -> None:
    """Passes delete the listed objects that have no owner (their owner reference stripped): an answer that did not
    apply the label selector must not hand them someone else's Deployment (seen with an emulator that ignores
    selectors: the operator deleted a Deployment it had never made)."""
    kube, answers = api

    def deployment(name: str, labels: dict[str, str] | None) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ml", **({"labels": labels} if labels else {})}}

    answers.listed["items"] = [
        deployment("dep-h100-pool", None),
        deployment("other-a100-pool", {DECISION_LABEL: "other"}),
        deployment("clef-h100-pool", {DECISION_LABEL: "clef"}),
    ]
    listed = await kube.list_labelled(DEPLOYMENTS, "ml", "clef")
    assert [item["metadata"]["name"] for item in listed or []] == ["clef-h100-pool"]
