#!/usr/bin/env bash
# FlashInfer's Hopper Gated DeltaNet prefill (a CuTe-DSL kernel, compiled on first use) for an offline GPU
# machine, in parts small enough to travel beside the code: only what that kernel and vLLM 0.26 need.
#
#   bash scripts/flashinfer_parts.sh pack DIR     # here (needs PyPI): DIR/fi-ir.tar.xz (49.7 MB),
#                                                 # DIR/fi-runtime.tar.xz (13.6 MB), DIR/fi-small.tar.xz (~6 MB)
#   bash scripts/flashinfer_parts.sh install DIR  # there: unpacks each part found in DIR into $SITE (default
#                                                 # /tmp/site) once, and prints the PYTHONPATH entry to add
#                                                 # after $SITE (the CuTe DSL's own packages)
#
# What is packed, at the versions vLLM 0.26 pins: flashinfer-python 0.6.14 without its C++ sources and
# headers (the SM90 GDN prefill is CuTe DSL, not JIT-built C++), nvidia-cutlass-dsl 4.6.0 with its libs-core,
# libs-base and libs-cu13 parts, apache-tvm-ffi 0.1.10, quack-kernels 0.5.3 (once the CuTe DSL imports,
# vLLM's start-up kernel warm-up compiles a CuTe-DSL GEMM that imports quack; vLLM asks for quack >= 0.4.0, but
# 0.4.x does not import with CuTe DSL 4.6.0 and 0.6 needs 4.7, while the 0.5 series is built against 4.6.0) and
# fla-core 0.6.0 (FLA's Triton kernels, for bench/gdn_prefill.py). The CuTe DSL's MLIR library and its runtime library are parts
# of their own. The parts can arrive in separate runs on a machine that keeps /tmp between them; a part
# too large for one transfer can be cut with `split -b` and joined with `cat` before `install`.
set -euo pipefail
FLASHINFER=0.6.14
CUTLASS_DSL=4.6.0
TVM_FFI=0.1.10
FLA=0.6.0
QUACK=0.5.3
IR_LIBRARY=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
RUNTIME_LIBRARY=nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so

pack() {
  local out; out="$(mkdir -p "$1" && cd "$1" && pwd)"
  local tmp; tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' RETURN
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$tmp/wheels" "flashinfer-python==$FLASHINFER" "nvidia-cutlass-dsl==$CUTLASS_DSL" \
    "nvidia-cutlass-dsl-libs-core==$CUTLASS_DSL" "nvidia-cutlass-dsl-libs-base==$CUTLASS_DSL" \
    "nvidia-cutlass-dsl-libs-cu13==$CUTLASS_DSL" "apache-tvm-ffi==$TVM_FFI" "fla-core==$FLA" \
    "quack-kernels==$QUACK"
  mkdir -p "$tmp/site"
  for wheel in "$tmp"/wheels/*.whl; do
    python3 -m zipfile -e "$wheel" "$tmp/site"
  done
  rm -rf "$tmp"/site/flashinfer/data/{cccl,cutlass,spdlog,csrc,include}
  tar -C "$tmp/site" -cf - "$IR_LIBRARY" | xz -T0 -6 > "$out/fi-ir.tar.xz"
  tar -C "$tmp/site" -cf - "$RUNTIME_LIBRARY" | xz -T0 -6 > "$out/fi-runtime.tar.xz"
  tar -C "$tmp/site" --exclude "./$IR_LIBRARY" --exclude "./$RUNTIME_LIBRARY" -cf - . | xz -T0 -9 > "$out/fi-small.tar.xz"
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
