"""``python -m clef_operator``: run the operator (kopf) with namespace scoping, liveness and peering."""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Sequence

import kopf

from clef_operator.constants import AUTO_BACKEND, BACKENDS, PEERING_LIFETIME
from clef_operator.deployment_backend import DEFAULT_STORAGE_INITIALIZER_IMAGE

DEFAULT_PEERING = "clef-operator"
MIN_PEERING_LIFETIME = 11  # kopf writes the keep-alive up to 10 s before it expires


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m clef_operator``."""
    parser = argparse.ArgumentParser(prog="python -m clef_operator", description=__doc__)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="watch ClefDecisions in this namespace (repeatable; globs allowed)",
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch ClefDecisions in every namespace (the default)"
    )
    parser.add_argument(
        "--liveness-port", type=int, default=8080, help="port of the liveness endpoint GET /healthz (0 disables it)"
    )
    parser.add_argument("--liveness-host", default="0.0.0.0", help="address the liveness endpoint binds to")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering",
        default=DEFAULT_PEERING,
        metavar="NAME",
        help="kopf peering object shared by replicas: only the highest priority one works",
    )
    peering.add_argument(
        "--standalone", action="store_true", help="no peering: for a single replica (or local development)"
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority; default: random per process, so replicas never tie",
    )
    parser.add_argument(
        "--peering-lifetime",
        type=int,
        default=PEERING_LIFETIME,
        metavar="SECONDS",
        help="how long a replica's peering keep-alive counts as live: the longest a killed replica keeps the "
        f"others (and its own restart) paused (default {PEERING_LIFETIME}; at least {MIN_PEERING_LIFETIME})",
    )
    parser.add_argument(
        "--allow-host-path-prefix",
        action="append",
        default=[],
        metavar="DIR",
        help="let ClefDecisions put their compile cache on a hostPath under DIR (repeatable; "
        "absolute; default: hostPath caches are refused)",
    )
    parser.add_argument(
        "--default-backend",
        choices=[AUTO_BACKEND, *BACKENDS],
        default=AUTO_BACKEND,
        help="the backend of ClefDecisions without spec.backend; auto (the default): kserve where the cluster "
        "serves InferenceServices, else deployment (decided once per ClefDecision)",
    )
    parser.add_argument(
        "--storage-initializer-image",
        default=DEFAULT_STORAGE_INITIALIZER_IMAGE,
        metavar="IMAGE",
        help="the deployment backend's init container that fetches hf://, s3:// and gs:// releases "
        f"(default {DEFAULT_STORAGE_INITIALIZER_IMAGE}, KServe's own)",
    )
    parser.add_argument("--verbose", action="store_true", help="log more")
    parser.add_argument("--debug", action="store_true", help="log everything, including API calls")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the operator until it is stopped."""
    args = build_parser().parse_args(argv)
    if args.liveness_port < 0 or args.liveness_port > 65535:
        build_parser().error("--liveness-port must be between 0 and 65535")
    if args.peering_lifetime < MIN_PEERING_LIFETIME:
        build_parser().error(f"--peering-lifetime must be at least {MIN_PEERING_LIFETIME} seconds")
    for prefix in args.allow_host_path_prefix:
        if not prefix.startswith("/") or os.path.normpath(prefix) == "/":
            build_parser().error(f"--allow-host-path-prefix {prefix!r}: give an absolute folder other than /")
    import clef_operator.handlers  # noqa: F401  (registers the handlers in kopf's default registry)
    from clef_operator.pass_state import Policy
    from clef_operator.work_queue import OperatorState

    memo = kopf.Memo()
    memo.clef = OperatorState(
        policy=Policy(
            host_path_prefixes=tuple(os.path.normpath(prefix) for prefix in args.allow_host_path_prefix),
            default_backend=args.default_backend,
            storage_initializer_image=args.storage_initializer_image,
        ),
        peering_lifetime=args.peering_lifetime,
    )

    kopf.configure(verbose=args.verbose, debug=args.debug)
    liveness = f"http://{args.liveness_host}:{args.liveness_port}/healthz" if args.liveness_port else None
    priority = args.priority if args.priority is not None else random.randint(1, 2**31 - 1)
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=liveness,
        standalone=args.standalone,
        peering_name=None if args.standalone else args.peering,
        priority=priority,
        memo=memo,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
