#!/usr/bin/env bash
# The Debian packages the container images and the real node need (clef_cluster.images, clef_cluster.node):
# mmdebstrap (the images' root filesystems), containerd (its CRI plugin) and runc, the CNI plugins (bridge,
# host-local, loopback, portmap in /usr/lib/cni), nftables (kube-proxy's nftables mode) and iptables (its nf_tables
# backend, for kubelet's and portmap's rules), iproute2 (ip netns, veth) and util-linux (nsenter).
# A no-op when they are installed; otherwise it needs root (apt-get).
set -euo pipefail
packages=(mmdebstrap containerd runc containernetworking-plugins nftables iptables iproute2 util-linux prometheus)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "the images and the real node need these Debian packages; run as root: apt-get install ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q "${missing[@]}"
