"""``python -m clef_cluster build|up|down|env|status|claims|import|exec``: the real-cluster tooling from a shell.

python -m clef_cluster up                  # build once (cached), start everything, print the env
python -m clef_cluster up --metrics        # ... with Prometheus and prometheus-adapter (custom metrics for HPAs)
python -m clef_cluster up --keda           # ... and KEDA's operator and metrics server (external metrics)
eval "$(python -m clef_cluster env)"       # KUBECONFIG for kubectl and helm
python -m clef_cluster claims ml-serving   # the namespace and bound claims the README's ClefDecision mounts;
                      # prints each claim's folder on this machine (a hostPath volume: put the release there)
python -m clef_cluster import IMAGE.tar    # an OCI archive into the real node's containerd (imagePullPolicy: Never)
python -m clef_cluster exec -- curl http://NAME.NAMESPACE.svc/   # a command in the node's network namespace,
                      # where Service and pod addresses route and nothing else does; Service names resolve there
python -m clef_cluster down
python -m clef_cluster images              # build the operator and CPU predictor images once (cached), print them
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from clef_cluster import adapter, images, keda
from clef_cluster import build as building
from clef_cluster.cluster import Cluster, ClusterError, down, up
from clef_cluster.metrics import PrometheusMissingError
from clef_cluster.netns import NetworkError
from clef_cluster.node import NodeError
from clef_cluster.storage import make_volume_folders, namespace_with_claims
from clef_cluster.versions import bin_dir, cache_root

DIR_ENV = "CLEF_CLUSTER_DIR"
VOLUMES = "volumes"  # the claims' hostPath folders, under the cluster folder


def default_folder() -> Path:
    """Where ``up`` keeps the running cluster: $CLEF_CLUSTER_DIR, else <cache>/run."""
    return Path(os.environ.get(DIR_ENV, cache_root() / "run"))


TAKES_ARGUMENTS = frozenset({"claims", "import", "exec"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clef_cluster", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "command", choices=["build", "images", "up", "down", "env", "status", "claims", "import", "exec"]
    )
    parser.add_argument(
        "arguments", nargs="*", help="claims: the namespace (ml-serving); import: archives; exec: -- CMD"
    )
    parser.add_argument("--dir", type=Path, default=None, help=f"cluster folder (default ${DIR_ENV} or <cache>/run)")
    parser.add_argument("--no-kserve", action="store_true", help="no KServe controller (and no KServe build)")
    parser.add_argument("--no-nodes", action="store_true", help="no fake GPU node pools")
    parser.add_argument("--no-node", action="store_true", help="no real node (containerd, kubelet, kube-proxy)")
    parser.add_argument(
        "--metrics", action="store_true", help="Prometheus and prometheus-adapter (custom.metrics.k8s.io)"
    )
    parser.add_argument(
        "--keda",
        action="store_true",
        help="KEDA's operator and metrics server (external.metrics.k8s.io); implies --metrics",
    )
    args = parser.parse_args(argv)
    arguments = args.arguments
    if arguments and args.command not in TAKES_ARGUMENTS:
        parser.error(f"{args.command} takes no arguments (options go before or after it): {' '.join(arguments)}")
    folder = (args.dir or default_folder()).resolve()
    try:
        if args.command == "build":
            print(building.build(with_kserve=not args.no_kserve))
            if args.metrics or args.keda:
                print(adapter.build())
            if args.keda:
                print("\n".join(str(path) for path in keda.build().values()))
        elif args.command == "up":
            cluster = up(
                folder,
                with_kserve=not args.no_kserve,
                with_nodes=not args.no_nodes,
                with_node=not args.no_node,
                with_metrics=args.metrics,
                with_keda=args.keda,
            )
            _print_env(cluster)
        elif args.command == "down":
            down(folder)
        elif args.command == "claims":
            cluster, namespace = Cluster.load(folder), arguments[0] if arguments else "ml-serving"
            root = cluster.folder / VOLUMES
            for claim, path in make_volume_folders(namespace, root).items():
                print(f"{claim} {path}")
            cluster.apply(namespace_with_claims(namespace, root))
        elif args.command == "images":
            for image in images.build_all().values():
                print(f"{image.reference} {image.archive}")
        elif args.command == "import":
            cluster = Cluster.load(folder)
            for archive in arguments:
                print("\n".join(cluster.node.import_image(Path(archive))))
        elif args.command == "exec":
            cluster = Cluster.load(folder)
            if not arguments:
                parser.error("exec needs a command: exec -- CMD [ARGS...]")
            command = cluster.network.client_command(arguments, cluster.service_hosts())
            return subprocess.run(command, env={**os.environ, **cluster.env()}, check=False).returncode
        elif args.command == "env":
            _print_env(Cluster.load(folder))
        else:
            cluster = Cluster.load(folder)
            for process in cluster.processes:
                print(f"{process.name:24} pid {process.pid:7}  {'running' if process.alive() else 'stopped'}")
            print(f"binaries: {bin_dir()}")
            print(f"network namespace: {cluster.network.name}, API server {cluster.server}")
    except (ClusterError, NodeError, NetworkError, images.ImageBuildError, PrometheusMissingError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def _print_env(cluster: Cluster) -> None:
    for key, value in cluster.env().items():
        print(f"export {key}={shlex.quote(value)}")


if __name__ == "__main__":
    sys.exit(main())
