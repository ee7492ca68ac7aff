"""Everything the predictor uses of KServe's, uvicorn's and argparse's internals, named here, in one place.

``tests/predictor/test_compat.py`` pins each use to the versions it was checked against
(:data:`CHECKED_VERSIONS`): an upgrade of one of them fails that test loudly, naming what to re-check here
and in the modules listed beside each name, before anything misbehaves at run time.

- argparse: a parser's actions and option table (``_actions``, ``_option_string_actions``) and
  ``_add_action``, to offer KServe's model-server flags with dashes too (:func:`predictor.cli.add_kserve_args`);
- KServe: the model-server parser's actions, ``ModelServer._rest_server`` (the uvicorn server it builds,
  configured by :class:`predictor.http.server_limits.ClefModelServer`), ``GRPCServer``'s ``_port``,
  ``_data_plane``, ``_model_repository_extension`` and ``_server``
  (:class:`~predictor.http.server_limits.ClefGRPCServer`), and ``BaseKServeModel.__init__`` (a base of
  ``kserve.Model``) assigning ``ready`` and ``engine`` (the setters of :class:`predictor.model.ClefModel`);
- uvicorn: ``H11Protocol``'s ``app``, ``conn``, ``cycle``, ``connections``, ``tasks``, ``transport`` and ``loop``
  (:class:`~predictor.http.server_limits.HeaderDeadlineProtocol`).
"""

from __future__ import annotations

import argparse
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import kserve

CHECKED_VERSIONS = {"kserve": "0.21.0", "uvicorn": "0.54.0", "h11": "0.16.0"}
"""The versions whose internals the names below were read from (a different one must be re-checked)."""
H11_PROTOCOL_ATTRIBUTES = ("app", "conn", "cycle", "connections", "tasks", "transport", "loop")
GRPC_SERVER_ATTRIBUTES = ("_port", "_data_plane", "_model_repository_extension", "_server")
MODEL_ATTRIBUTES_KSERVE_ASSIGNS = ("ready", "engine")


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
