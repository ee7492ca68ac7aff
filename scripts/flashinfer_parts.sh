#!/usr/bin/env bash
# FlashInfer's Hopper Gated DeltaNet prefill (a CuTe-DSL kernel, compiled on first use) for an offline GPU
# machine, in parts small enough to travel beside the code: only what that kernel needs.
#
#   bash scripts/flashinfer_parts.sh pack DIR     # here (needs PyPI): DIR/fi-small.tar.xz + DIR/fi-ir.tar.xz
#   bash scripts/flashinfer_parts.sh install DIR  # there: unpacks into $SITE (default /tmp/site), prints the
#                                                 # PYTHONPATH entries to add (the CuTe DSL's own packages)
#
# What is packed, at the versions vLLM 0.26 pins: flashinfer-python 0.6.14 without its C++ sources and
# headers (the SM90 GDN prefill is CuTe DSL, not JIT-built C++), nvidia-cutlass-dsl 4.6.0 with its
# libs-core, libs-base and libs-cu13 parts, apache-tvm-ffi 0.1.10 and fla-core 0.6.0 (FLA's Triton kernels,
# for bench/gdn_prefill.py). The CuTe DSL's MLIR library (180 MB unpacked, 49 MB compressed) is a part of
# its own; everything else compresses to about 12 MB. `install` accepts the parts in any number of runs:
# each part unpacks once, so the two can arrive separately on a machine that keeps /tmp between runs.
set -euo pipefail
FLASHINFER=0.6.14
CUTLASS_DSL=4.6.0
TVM_FFI=0.1.10
FLA=0.6.0
IR_LIBRARY=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so

pack() {
  local out; out="$(mkdir -p "$1" && cd "$1" && pwd)"
  local tmp; tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' RETURN
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$tmp/wheels" "flashinfer-python==$FLASHINFER" "nvidia-cutlass-dsl==$CUTLASS_DSL" \
    "nvidia-cutlass-dsl-libs-core==$CUTLASS_DSL" "nvidia-cutlass-dsl-libs-base==$CUTLASS_DSL" \
    "nvidia-cutlass-dsl-libs-cu13==$CUTLASS_DSL" "apache-tvm-ffi==$TVM_FFI" "fla-core==$FLA"
  mkdir -p "$tmp/site"
  for wheel in "$tmp"/wheels/*.whl; do
    python3 -m zipfile -e "$wheel" "$tmp/site"
  done
  rm -rf "$tmp"/site/flashinfer/data/{cccl,cutlass,spdlog,csrc,include}
  tar -C "$tmp/site" -cf - "$IR_LIBRARY" | xz -T0 -6 > "$out/fi-ir.tar.xz"
  tar -C "$tmp/site" --exclude "./$IR_LIBRARY" -cf - . | xz -T0 -9 > "$out/fi-small.tar.xz"
  ls -l "$out"/fi-*.tar.xz >&2
}

install() {
  local site="${SITE:-/tmp/site}" part stamp
  mkdir -p "$site"
  for part in "$1"/fi-*.tar.xz; do
    [ -e "$part" ] || continue
    stamp="$site/.unpacked-$(basename "$part")"
    [ -f "$stamp" ] && continue
    xz -dc "$part" | tar -x -C "$site" --no-same-owner
    touch "$stamp"
  done
  echo "$site/nvidia_cutlass_dsl/dsl_packages"
}

case "${1:-}" in
  pack) pack "${2:?output folder}" ;;
  install) install "${2:?folder holding the parts}" ;;
  *) echo "usage: $0 pack|install DIR" >&2; exit 2 ;;
esac
