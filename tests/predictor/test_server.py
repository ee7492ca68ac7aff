"""Pins what ``predictor.http.server`` and ``predictor.http.grpc_access`` lean on in uvicorn, KServe and
grpcio."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
import uvicorn
from kserve.errors import ModelNotFound, ModelNotReady
from kserve.model_repository import ModelRepository
from uvicorn.server import ServerState

from predictor.core.errors import Unavailable
from predictor.http.auth import ApiKeys
from predictor.http.errors import bad_request
from predictor.http.grpc_access import AccessInterceptor, grpc_status
from predictor.http.server import HttpLimits, ServingSwitch, bounded_protocol
from predictor.serving.lifecycle import Lifecycle, Phase


def test_kserve_serves_grpc_by_default_and_the_predictor_does_not() -> None:
    from kserve.model_server import parser as kserve_parser

    from predictor.cli import build_parser

    assert kserve_parser.get_default("enable_grpc") is True  # what the predictor's own default overrides
    assert build_parser().parse_args([]).enable_grpc is False
    assert build_parser().parse_args(["--enable_grpc", "true"]).enable_grpc is True


async def _inner_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"inner"})


def _protocol(limits: HttpLimits) -> Any:
    config = uvicorn.Config(_inner_app, lifespan="off")
    config.load()
    protocol = bounded_protocol(limits)(
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.new_event_loop()
    )
    assert protocol._inner_app is config.loaded_app and protocol.app == protocol._admit
    return protocol


def _call(protocol: Any, method: str, path: str, headers: list[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    protocol.loop.run_until_complete(protocol.app(scope, receive, send))
    return sent


def test_content_length_with_transfer_encoding_gets_400_and_connection_close() -> None:
    protocol = _protocol(HttpLimits())
    sent = _call(protocol, "POST", "/v1/systemone", [(b"content-length", b"5"), (b"transfer-encoding", b"chunked")])
    assert sent[0]["status"] == 400 and (b"connection", b"close") in sent[0]["headers"]
    assert b"Content-Length and Transfer-Encoding" in sent[1]["body"]
    assert _call(protocol, "POST", "/v1/systemone", [(b"content-length", b"5")])[1]["body"] == b"inner"


def test_past_the_connection_limit_only_probes_get_through() -> None:
    protocol = _protocol(HttpLimits(max_connections=2))
    protocol.connections.update({object(), object()})  # uvicorn's own sets: the protocol reads their sizes
    refused = _call(protocol, "POST", "/v1/systemone", [])
    assert refused[0]["status"] == 429 and {(b"retry-after", b"1"), (b"connection", b"close")} <= set(
        refused[0]["headers"]
    )
    assert b"--max-connections 2" in refused[1]["body"]
    assert _call(protocol, "GET", "/v1/systemone", [])[0]["status"] == 429
    for path in ("/health/live", "/v1/models/clef-flash", "/v2/models/clef-flash/ready", "/health", "/jev/health"):
        assert _call(protocol, "GET", path, [])[1]["body"] == b"inner", path
    protocol.tasks.update(object() for _ in range(2 + 64 + 1))  # the probes' reserve is used up too
    assert _call(protocol, "GET", "/health/live", [])[0]["status"] == 429


def test_repository_unload_and_load_switch_the_model_out_of_service_and_back() -> None:
    lifecycle = Lifecycle("clef-flash")
    registry = ModelRepository()
    registry.models["clef-flash"] = SimpleNamespace(lifecycle=lifecycle)  # type: ignore[assignment]
    switch = ServingSwitch(model_registry=registry)

    async def scenario() -> None:
        with pytest.raises(ModelNotReady):
            await switch.unload("clef-flash")  # still loading: nothing to take out of service
        lifecycle.enter(Phase.OK)
        await switch.unload("clef-flash")
        assert lifecycle.phase is Phase.UNLOADED and lifecycle.live and not lifecycle.ready
        with pytest.raises(Unavailable, match="/v2/repository/models/clef-flash/load"):
            lifecycle.check_serving()
        await switch.load("clef-flash")
        assert lifecycle.ready
        await switch.load("clef-flash")
        with pytest.raises(ModelNotFound):
            await switch.load("other")
        lifecycle.engine_died("gone")
        with pytest.raises(ModelNotReady):
            await switch.load("clef-flash")

    asyncio.run(scenario())


def test_our_errors_keep_their_meaning_over_grpc() -> None:
    assert grpc_status(bad_request("not valid JSON", "inputs[0].data[1]")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "inputs[0].data[1]: not valid JSON",
    )
    code, message = grpc_status(Unavailable("the server is shutting down", "draining", 1))
    assert code == grpc.StatusCode.UNAVAILABLE and message.endswith("(retry after 1 s)")


class _Aborted(Exception):
    pass


def _outcome(interceptor: AccessInterceptor, method: str, metadata: tuple[tuple[str, str], ...]) -> Any:
    details = SimpleNamespace(method=f"/inference.GRPCInferenceService/{method}", invocation_metadata=metadata)
    passed = object()

    async def continuation(_: Any) -> Any:
        return passed

    async def scenario() -> Any:
        handler = await interceptor.intercept_service(continuation, details)  # type: ignore[arg-type]
        if handler is passed:
            return "passed"

        async def abort(code: grpc.StatusCode, message: str) -> None:
            raise _Aborted(code, message)

        try:
            await handler.unary_unary(b"", SimpleNamespace(abort=abort))
        except _Aborted as aborted:
            return aborted.args
        raise AssertionError("a refusal must abort")

    return asyncio.run(scenario())


def test_access_interceptor_needs_a_key_for_every_method_and_closes_the_repository() -> None:
    keys = ApiKeys(None, "k1,k2")
    interceptor = AccessInterceptor(keys, enable_model_repository=False)
    assert _outcome(interceptor, "ServerLive", ())[0] == grpc.StatusCode.UNAUTHENTICATED
    wrong = _outcome(interceptor, "ModelInfer", (("authorization", "Bearer nope"),))
    assert wrong[0] == grpc.StatusCode.UNAUTHENTICATED
    assert _outcome(interceptor, "ModelInfer", (("authorization", "Bearer k2"),)) == "passed"
    assert _outcome(interceptor, "RepositoryModelUnload", (("authorization", "Bearer k1"),))[0] == (
        grpc.StatusCode.UNIMPLEMENTED
    )
    open_server = AccessInterceptor(ApiKeys(None, None), enable_model_repository=True)
    assert _outcome(open_server, "RepositoryModelUnload", ()) == "passed"


def test_the_data_plane_lists_the_repository_extension_only_when_enabled() -> None:
    from kserve.model_repository import ModelRepository

    from predictor.http.server import ClefDataPlane

    assert ClefDataPlane(ModelRepository(), enable_model_repository=False).metadata()["extensions"] == []
    opened = ClefDataPlane(ModelRepository(), enable_model_repository=True).metadata()
    assert opened["extensions"] == ["model_repository_extension"] and opened["name"] == "kserve"
