"""Contract tests of predictor.http.compat: the KServe, uvicorn and argparse internals the predictor uses exist,
in the versions they were checked against. A failure here after an upgrade names what to re-check."""

from __future__ import annotations

import argparse
import asyncio
import copy
import importlib.metadata
import inspect
import json
import subprocess
import sys
from typing import Any

import fastapi
import kserve
import pytest
from kserve.model import BaseKServeModel
from kserve.model_repository import ModelRepository
from kserve.model_server import ModelServer
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.grpc.server import GRPCServer
from kserve.protocol.model_repository_extension import ModelRepositoryExtension
from kserve.protocol.rest.server import RESTServer
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.version import Version
from uvicorn.protocols.http.h11_impl import H11Protocol

from predictor.http import compat
from tests.predictor.conftest import REPO


@pytest.mark.parametrize("package", sorted(compat.CHECKED_VERSIONS))
def test_installed_versions_are_the_checked_ones(package: str) -> None:
    installed = importlib.metadata.version(package)
    assert Version(installed).release[:2] == Version(compat.CHECKED_VERSIONS[package]).release, (
        f"{package} {installed} is installed but predictor.http.compat was checked against the "
        f"{compat.CHECKED_VERSIONS[package]} series: re-check every internal listed there, then update "
        "CHECKED_VERSIONS and the serve extra's bounds"
    )


@pytest.mark.parametrize("package", sorted(compat.CHECKED_VERSIONS))
def test_the_serve_extra_allows_the_checked_series_only(package: str) -> None:
    """A user's ``pip install clef-serving[serve]`` gets the internals this module was checked against."""
    requirements = [Requirement(text) for text in importlib.metadata.requires("clef-serving") or []]
    (served,) = [item for item in requirements if item.name == package and item.marker == Marker('extra == "serve"')]
    major, minor = Version(compat.CHECKED_VERSIONS[package]).release
    allowed = [f"{major}.{minor}.0", f"{major}.{minor}.99"]
    refused = [f"{major}.{minor + 1}.0", f"{major}.{minor - 1}.99"]
    assert all(served.specifier.contains(version) for version in allowed), served
    assert not any(served.specifier.contains(version) for version in refused), served


def test_kserve_model_is_still_a_base_kserve_model() -> None:
    assert BaseKServeModel in kserve.Model.__mro__


@pytest.mark.parametrize(
    ("owner", "attributes"),
    [
        (H11Protocol, compat.H11_PROTOCOL_ATTRIBUTES),
        (GRPCServer.__init__, compat.GRPC_SERVER_ATTRIBUTES),
        (BaseKServeModel.__init__, compat.MODEL_ATTRIBUTES_KSERVE_ASSIGNS),
        (ModelServer, compat.MODEL_SERVER_ATTRIBUTES),
    ],
)
def test_the_internal_attributes_are_still_assigned(owner: object, attributes: tuple[str, ...]) -> None:
    source = inspect.getsource(owner)  # type: ignore[arg-type]
    missing = [name for name in attributes if f"self.{name} =" not in source]
    assert not missing, f"{getattr(owner, '__qualname__', owner)} no longer assigns {missing}"


def test_kserve_flags_can_be_copied_with_dashes() -> None:
    actions = compat.kserve_parser_actions()
    options = {option for action in actions for option in action.option_strings}
    assert {"--http_port", "--grpc_port", "--enable_grpc"} <= options
    assert not any(isinstance(action, argparse._HelpAction) for action in actions)
    parser = argparse.ArgumentParser()
    assert "-h" in compat.declared_options(parser) and "--http_port" not in compat.declared_options(parser)
    group = parser.add_argument_group("KServe")
    port = next(action for action in actions if "--http_port" in action.option_strings)
    dashed = copy.copy(port)
    dashed.option_strings = ["--http_port", "--http-port"]
    compat.add_action(group, dashed)
    assert parser.parse_args(["--http-port", "9001"]).http_port == 9001
    assert parser.parse_args(["--http_port", "9002"]).http_port == 9002


class _Stoppable:
    """Records the stop calls KServe makes (a gRPC server's ``stop(sig)``, an aio server's ``stop(grace)``)."""

    def __init__(self) -> None:
        self.stops: list[Any] = []

    async def stop(self, *args: Any, **kwargs: Any) -> None:
        self.stops.append((args, kwargs))


def test_kserve_stops_the_grpc_server_given_to_it() -> None:
    """ModelServer.stop stops the gRPC server set by use_grpc_server; GRPCServer.stop stops the aio server set by
    attach_aio_server, with its grace period; the parts a GRPCServer was built with read back."""
    repository = ModelRepository()
    extension = ModelRepositoryExtension(model_registry=repository)
    assert compat.model_registry(extension) is repository
    data_plane = DataPlane(model_registry=repository)
    grpc_server = GRPCServer(9123, data_plane, extension, kwargs={}, grace_period=7)
    assert compat.grpc_server_parts(grpc_server) == compat.GrpcServerParts(9123, data_plane, extension)

    async def scenario() -> tuple[_Stoppable, _Stoppable]:
        aio_server = _Stoppable()
        compat.attach_aio_server(grpc_server, aio_server)  # type: ignore[arg-type]
        await grpc_server.stop()
        fake_grpc = _Stoppable()
        server = ModelServer(enable_grpc=False, registered_models=repository)
        compat.use_grpc_server(server, fake_grpc)  # type: ignore[arg-type]
        server.stop(15)
        for _ in range(50):
            if fake_grpc.stops:
                break
            await asyncio.sleep(0.01)
        return aio_server, fake_grpc

    aio_server, fake_grpc = asyncio.run(scenario())
    assert aio_server.stops == [((), {"grace": 7})]
    assert fake_grpc.stops == [((15,), {})]


def _registered_routes() -> list[str]:
    """The paths KServe's REST server registers for a plain model (not one of its OpenAI models)."""
    repository = ModelRepository()
    repository.update(kserve.Model("clef-flash"))
    extension = ModelRepositoryExtension(model_registry=repository)
    server = RESTServer("kserve.model_server:app", DataPlane(model_registry=repository), extension, http_port=0)
    app = fastapi.FastAPI()
    server._register_endpoints(app)
    return sorted(route.path for route in app.routes)  # type: ignore[attr-defined]


_SKIPPED_ROUTES = """
import json, sys
from predictor.http import compat
from tests.predictor.test_compat import _registered_routes
compat.skip_kserve_openai_endpoints()
print(json.dumps({"routes": _registered_routes(), "vllm": "vllm" in sys.modules}))
"""


def test_kserve_without_its_openai_import_registers_the_same_routes() -> None:
    """With skip_kserve_openai_endpoints (in a fresh interpreter: it marks the process's module table), KServe's REST
    server registers the routes it registers by itself, and imports no vLLM for them."""
    done = subprocess.run(
        [sys.executable, "-c", _SKIPPED_ROUTES], capture_output=True, text=True, timeout=120, check=True, cwd=REPO
    )
    skipped = json.loads(done.stdout.splitlines()[-1])
    assert "/v1/models/{model_name}:predict" in skipped["routes"] and "/v2/health/ready" in skipped["routes"]
    assert not any(path.startswith("/openai") for path in skipped["routes"])
    assert not skipped["vllm"]
    assert skipped["routes"] == _registered_routes()  # KServe's own path, in this worker


def test_kserve_answers_both_server_metadata_calls_from_the_data_plane_listing_the_repository() -> None:
    """ClefDataPlane filters what KServe's ``DataPlane.metadata`` lists; both calls must still answer from it."""
    from kserve.protocol.grpc.servicer import InferenceServicer
    from kserve.protocol.rest.v2_endpoints import V2Endpoints

    assert compat.KSERVE_REPOSITORY_EXTENSION in DataPlane(ModelRepository()).metadata()["extensions"]
    assert "self._data_plane.metadata()" in inspect.getsource(InferenceServicer.ServerMetadata)
    assert "self.dataplane.metadata()" in inspect.getsource(V2Endpoints.metadata)
    start = inspect.getsource(ModelServer.start)
    assert start.count("self.dataplane,") == 3, "the REST and gRPC servers no longer take ModelServer.dataplane"
