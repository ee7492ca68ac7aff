#!/usr/bin/env bash
# Install the Debian tools the container images need (clef_cluster/images.py, tests/images/): mmdebstrap builds their
# root filesystems, containerd and runc import and run them. Needs root (apt-get). Idempotent: does nothing when the
# tools are already installed.
set -euo pipefail
tools=(mmdebstrap containerd ctr runc)
missing=()
for tool in "${tools[@]}"; do
  command -v "$tool" > /dev/null || missing+=("$tool")
done
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
echo "installing the image tools (missing: ${missing[*]})"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q mmdebstrap containerd runc
