"""Everything the predictor uses of KServe's, uvicorn's and argparse's internals, named here, in one place.

``tests/predictor/test_compat.py`` pins each use to the versions it was checked against
(:data:`CHECKED_VERSIONS`, the release series the ``serve`` extra allows): an upgrade of one of them fails that test
loudly, naming what to re-check here and in the modules listed beside each name, before anything misbehaves at run
time.

- argparse: a parser's actions and option table (``_actions``, ``_option_string_actions``) and
  ``_add_action``, to offer KServe's model-server flags with dashes too (:func:`predictor.cli.add_kserve_args`;
  KServe's parser as a ``parents=`` parser would give the underscore spellings only, which vLLM's parser rewrites
  to dashes before matching);
- KServe: the model-server parser's actions; ``ModelServer._rest_server`` (the uvicorn server it builds,
  configured by :class:`predictor.http.server.ClefModelServer`) and ``ModelServer._grpc_server`` (the gRPC
  server its ``stop`` stops); ``GRPCServer``'s ``_port``, ``_data_plane``, ``_model_repository_extension`` and
  ``_server`` (read and set for :class:`~predictor.http.server.ClefGRPCServer`);
  ``ModelRepositoryExtension._model_registry`` (:class:`~predictor.http.server.ServingSwitch`);
  ``DataPlane.metadata`` listing :data:`KSERVE_REPOSITORY_EXTENSION` whether or not the repository routes are
  open, and answering both server-metadata calls (HTTP ``GET /v2``, gRPC ``ServerMetadata``) from
  ``ModelServer.dataplane`` (:class:`~predictor.http.server.ClefDataPlane`); and
  ``BaseKServeModel.__init__`` (a base of ``kserve.Model``) assigning ``ready`` and ``engine`` (the setters of
  :class:`predictor.model.ClefModel`); ``RESTServer._register_endpoints`` taking an ImportError of its OpenAI
  endpoints' module as "none to register" (:func:`skip_kserve_openai_endpoints`);
- uvicorn: ``H11Protocol``'s ``app``, ``conn``, ``cycle``, ``connections``, ``tasks``, ``transport`` and ``loop``
  (:class:`~predictor.http.server.HeaderDeadlineProtocol`, a subclass).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import kserve
    from kserve.model_repository import ModelRepository
    from kserve.protocol.dataplane import DataPlane
    from kserve.protocol.grpc.server import GRPCServer
    from kserve.protocol.model_repository_extension import ModelRepositoryExtension

CHECKED_VERSIONS = {"kserve": "0.21", "uvicorn": "0.54", "h11": "0.16"}
"""The release series whose internals the names below were read from (another must be re-checked); the ``serve``
extra in pyproject.toml holds installs to them."""
H11_PROTOCOL_ATTRIBUTES = ("app", "conn", "cycle", "connections", "tasks", "transport", "loop")
GRPC_SERVER_ATTRIBUTES = ("_port", "_data_plane", "_model_repository_extension", "_server")
MODEL_SERVER_ATTRIBUTES = ("_rest_server", "_grpc_server")
MODEL_ATTRIBUTES_KSERVE_ASSIGNS = ("ready", "engine")
KSERVE_REPOSITORY_EXTENSION = "model_repository_extension"
"""The protocol extension KServe's ``DataPlane.metadata`` lists for the model-repository API (always)."""
KSERVE_OPENAI_ENDPOINTS_MODULE = "kserve.protocol.rest.openai.config"
"""The module KServe's REST server imports at every start to register OpenAI endpoints for its own ``OpenAIModel``
subclasses (Clef's model is not one); its types import vLLM's OpenAI server protocol, vLLM included."""


def kserve_parser_actions() -> list[argparse.Action]:
    """The flags of KServe's model-server parser (``--http_port`` ...), its help flag left out."""
    from kserve.model_server import parser as kserve_parser

    return [action for action in kserve_parser._actions if not isinstance(action, argparse._HelpAction)]


def declared_options(parser: argparse.ArgumentParser) -> Collection[str]:
    """Every option string ``parser`` already declares (``--log-config-file`` ...)."""
    return parser._option_string_actions


def add_action(group: argparse._ArgumentGroup, action: argparse.Action) -> None:
    """Declare an existing ``action`` object (a copy of another parser's) in ``group``."""
    group._add_action(action)


def rest_server(server: kserve.ModelServer) -> Any:
    """The uvicorn server KServe's ``ModelServer`` built in ``setup_event_loop`` (None before it, or with workers)."""
    return server._rest_server


def use_grpc_server(server: kserve.ModelServer, grpc_server: GRPCServer) -> None:
    """Make ``grpc_server`` the gRPC server that KServe's ``ModelServer.stop`` stops."""
    server._grpc_server = grpc_server


@dataclass(frozen=True)
class GrpcServerParts:
    """What KServe's ``GRPCServer`` was built with: the port to listen on, the data plane and the repository
    extension its servicer serves."""

    port: int
    data_plane: DataPlane
    repository: ModelRepositoryExtension


def grpc_server_parts(server: GRPCServer) -> GrpcServerParts:
    """The port, data plane and repository extension ``server`` was built with."""
    return GrpcServerParts(server._port, server._data_plane, server._model_repository_extension)


def attach_aio_server(server: GRPCServer, aio_server: Any) -> None:
    """Give KServe's ``GRPCServer`` the running ``aio_server`` (a ``grpc.aio.Server``) that its ``stop`` stops, with
    its grace period."""
    server._server = aio_server


def model_registry(extension: ModelRepositoryExtension) -> ModelRepository:
    """The model registry KServe's repository extension was built over."""
    return extension._model_registry


def skip_kserve_openai_endpoints() -> None:
    """Make KServe's REST server take its "no OpenAI endpoints" branch without importing them.

    KServe imports :data:`KSERVE_OPENAI_ENDPOINTS_MODULE` inside a ``try`` that takes an ImportError as "not
    registered", and registers endpoints only for models that are its ``OpenAIModel``: none is here, so the import
    only costs time (3.5 s of a transformers-engine start on a 2-core CPU, for vLLM and its OpenAI protocol; on vLLM
    0.32 the import then fails anyway). ``None`` in ``sys.modules`` is Python's own mark for a module that cannot be
    imported. A process that imported the module already keeps it."""
    sys.modules.setdefault(KSERVE_OPENAI_ENDPOINTS_MODULE, None)  # type: ignore[arg-type]
