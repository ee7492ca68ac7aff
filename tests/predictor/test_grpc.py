"""KServe's gRPC service, asked for with ``--enable_grpc true``: bound to ``--host``, behind the API keys and the
HTTP limits, driven by a real gRPC client (grpcio + KServe's generated stubs)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub

from tests.predictor.conftest import (
    MODEL_NAME,
    Predictor,
    free_port,
    listening_addresses,
    simple_request,
    start_predictor,
    stop,
    tiny_server_args,
)

KEY = "grpc-key"
MAX_BODY_BYTES = 4096


@pytest.fixture(scope="module")
def grpc_server(
    toy_release: Path, tmp_path_factory: pytest.TempPathFactory, predictor_env: None
) -> Iterator[Predictor]:
    tmp = tmp_path_factory.mktemp("predictor-grpc")
    key_file = tmp / "keys"
    key_file.write_text(f"{KEY}\n")
    port = free_port()
    running = start_predictor(
        tmp,
        *tiny_server_args(toy_release),
        "--api-key-file",
        str(key_file),
        "--max-body-bytes",
        str(MAX_BODY_BYTES),
        "--enable_grpc",
        "true",
        "--grpc_port",
        str(port),
    )
    running.grpc_port = port  # type: ignore[attr-defined]
    yield running
    assert stop(running) == 0, running.log()[-3000:]


@pytest.fixture(scope="module")
def stub(grpc_server: Predictor) -> Iterator[GRPCInferenceServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{grpc_server.grpc_port}") as channel:  # type: ignore[attr-defined]
        yield GRPCInferenceServiceStub(channel)


def infer_request(*bodies: Any) -> pb.ModelInferRequest:
    """One BYTES input of System One requests as JSON text, as the HTTP V2 route takes them (bytes: as they are)."""
    tensor = pb.ModelInferRequest.InferInputTensor(
        name="request",
        datatype="BYTES",
        shape=[len(bodies)],
        contents=pb.InferTensorContents(
            bytes_contents=[body if isinstance(body, bytes) else json.dumps(body).encode() for body in bodies]
        ),
    )
    return pb.ModelInferRequest(model_name=MODEL_NAME, inputs=[tensor])


CALLS: dict[str, Callable[[GRPCInferenceServiceStub], Callable[..., Any]]] = {
    "ServerLive": lambda s: lambda **kw: s.ServerLive(pb.ServerLiveRequest(), **kw),
    "ServerReady": lambda s: lambda **kw: s.ServerReady(pb.ServerReadyRequest(), **kw),
    "ServerMetadata": lambda s: lambda **kw: s.ServerMetadata(pb.ServerMetadataRequest(), **kw),
    "ModelReady": lambda s: lambda **kw: s.ModelReady(pb.ModelReadyRequest(name=MODEL_NAME), **kw),
    "ModelMetadata": lambda s: lambda **kw: s.ModelMetadata(pb.ModelMetadataRequest(name=MODEL_NAME), **kw),
    "ModelInfer": lambda s: lambda **kw: s.ModelInfer(infer_request(simple_request()), **kw),
    "RepositoryModelUnload": lambda s: (
        lambda **kw: s.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=MODEL_NAME), **kw)
    ),
    "RepositoryModelLoad": lambda s: (
        lambda **kw: s.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=MODEL_NAME), **kw)
    ),
}


def status_of(call: Callable[..., Any], **kwargs: Any) -> tuple[Any, str]:
    try:
        call(timeout=60, **kwargs)
    except grpc.RpcError as error:
        return error.code(), error.details()
    return grpc.StatusCode.OK, ""


@pytest.mark.parametrize("method", sorted(CALLS))
def test_every_method_needs_a_valid_key(stub: GRPCInferenceServiceStub, method: str) -> None:
    call = CALLS[method](stub)
    code, details = status_of(call)
    assert code == grpc.StatusCode.UNAUTHENTICATED and "authorization: Bearer" in details, (code, details)
    code, details = status_of(call, metadata=(("authorization", "Bearer not-the-key"),))
    assert (code, details) == (grpc.StatusCode.UNAUTHENTICATED, "the API key is not valid")
    code, details = status_of(call, metadata=(("authorization", KEY),))
    assert code == grpc.StatusCode.UNAUTHENTICATED, "a key without the Bearer scheme is not accepted"


def test_with_a_key_it_answers(stub: GRPCInferenceServiceStub) -> None:
    auth = (("authorization", f"Bearer {KEY}"),)
    assert stub.ServerReady(pb.ServerReadyRequest(), metadata=auth, timeout=60).ready
    assert stub.ModelMetadata(pb.ModelMetadataRequest(name=MODEL_NAME), metadata=auth, timeout=60).name == MODEL_NAME
    reply = stub.ModelInfer(infer_request(simple_request(), simple_request("second")), metadata=auth, timeout=120)
    answers = [json.loads(item) for item in reply.outputs[0].contents.bytes_contents]
    assert len(answers) == 2 and set(answers[0]["answers"]) == {"urgent", "topic", "tone"}


def test_repository_methods_stay_closed_with_a_key(stub: GRPCInferenceServiceStub) -> None:
    auth = (("authorization", f"Bearer {KEY}"),)
    for method in ("RepositoryModelUnload", "RepositoryModelLoad"):
        code, details = status_of(CALLS[method](stub), metadata=auth)
        assert code == grpc.StatusCode.UNIMPLEMENTED and "--enable-model-repository" in details
    assert stub.ModelReady(pb.ModelReadyRequest(name=MODEL_NAME), metadata=auth, timeout=60).ready


def test_server_metadata_lists_no_extension_the_server_does_not_serve(
    grpc_server: Predictor, stub: GRPCInferenceServiceStub
) -> None:
    """The repository methods are closed (``UNIMPLEMENTED``, above): neither server-metadata answer lists them."""
    auth = (("authorization", f"Bearer {KEY}"),)
    assert list(stub.ServerMetadata(pb.ServerMetadataRequest(), metadata=auth, timeout=60).extensions) == []
    over_http = httpx.get(f"{grpc_server.url}/v2", headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert over_http.status_code == 200 and over_http.json()["extensions"] == [], over_http.text


def test_bad_requests_are_invalid_argument_naming_the_field(stub: GRPCInferenceServiceStub) -> None:
    auth = (("authorization", f"Bearer {KEY}"),)
    code, details = status_of(lambda **kw: stub.ModelInfer(infer_request(b"{not json"), **kw), metadata=auth)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("inputs[0].data[0]: not valid JSON"), details
    bad = simple_request()
    bad["questions"]["topic"]["criteria"] = {"only": None}
    code, details = status_of(lambda **kw: stub.ModelInfer(infer_request(simple_request(), bad), **kw), metadata=auth)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("inputs[0].data[1].questions.topic"), details


def test_undecodable_tensors_are_invalid_argument(stub: GRPCInferenceServiceStub) -> None:
    auth = (("authorization", f"Bearer {KEY}"),)
    tensor = pb.ModelInferRequest.InferInputTensor(name="request", datatype="BYTES", shape=[1])
    for raw in (b"\xff\xff\xff\xff", b"\x01\x00"):  # an element length past the data; a cut length
        request = pb.ModelInferRequest(model_name=MODEL_NAME, inputs=[tensor], raw_input_contents=[raw])
        code, details = status_of(partial(stub.ModelInfer, request), metadata=auth)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "cannot be decoded" in details, (code, details)


def test_messages_over_the_body_limit_are_refused(stub: GRPCInferenceServiceStub) -> None:
    auth = (("authorization", f"Bearer {KEY}"),)
    code, details = status_of(
        lambda **kw: stub.ModelInfer(infer_request(simple_request("x" * MAX_BODY_BYTES)), **kw), metadata=auth
    )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and str(MAX_BODY_BYTES) in details, (code, details)


def test_grpc_listens_on_the_host_only(grpc_server: Predictor) -> None:
    addresses = listening_addresses(grpc_server.process.pid)
    assert ("127.0.0.1", grpc_server.grpc_port) in addresses, addresses  # type: ignore[attr-defined]
    assert all(host == "127.0.0.1" for host, _ in addresses), addresses
