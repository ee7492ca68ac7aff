# The clef-serving predictor (KServe model server + vLLM plugin) on the official vLLM image, which
# brings CUDA, PyTorch and vLLM. Build from the repository root:
#   docker build -f docker/predictor.Dockerfile -t clef-predictor:0.1.0 .
# BASE_IMAGE names another base holding Python, pip and vLLM with its GPU stack (a mirror of the official image, or
# one built without a registry: docs/container-images.md).
ARG BASE_IMAGE=vllm/vllm-openai:v0.26.0
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY pyproject.toml README.md /tmp/clef-serving/
COPY clef_head/ /tmp/clef-serving/clef_head/
COPY clef_plugin/ /tmp/clef-serving/clef_plugin/
COPY clef_tools/ /tmp/clef-serving/clef_tools/
COPY predictor/ /tmp/clef-serving/predictor/

# Installed like any distribution (not editable), then the sources are removed: the image imports only what
# the wheel holds. Every package already in the image (vLLM, PyTorch, the CUDA libraries) is pinned as a
# constraint, so installing the `serve` and `vllm` extras only adds what is missing: a dependency that would
# replace one of them fails the build instead of silently swapping the GPU stack.
RUN python3 -m pip list --format=freeze > /tmp/image-constraints.txt \
    && python3 -m pip install --no-cache-dir --constraint /tmp/image-constraints.txt "/tmp/clef-serving[serve,vllm]" \
    && rm -rf /tmp/image-constraints.txt /tmp/clef-serving

# Bytecode for every installed package: vLLM's Dockerfile installs vLLM and PyTorch with `uv pip install`, which writes
# none unless asked, and the predictor runs as a user that cannot write it next to them, so each start would compile
# torch, sympy, vLLM ... from source again (one H200 host: ready after 60.1 s without bytecode, 39.1-43.6 s with it;
# BENCHMARKS.md, R19). A file this Python cannot compile (another version's test file) cannot be imported either, so
# compile_dir's verdict on such files is not the build's.
RUN python3 -c "import compileall, site; [compileall.compile_dir(d, quiet=2, workers=0) for d in site.getsitepackages()]"

# vLLM's mega AOT artifact: a warm start loads the compiled graph as one artifact instead of splitting it again and
# loading each piece (vLLM's default from torch 2.12 on; vLLM 0.26 leaves it off on this image's torch 2.11). On one
# H200 vLLM's compilation step took 0.8-0.9 s instead of 4.7-5.2 s (R20), and the answers stayed within 1.9e-4 mean KL
# of the split graph's (R21; BENCHMARKS.md).
ENV VLLM_USE_MEGA_AOT_ARTIFACT=1

# The operator's InferenceServices start the predictor as `python -m predictor`.
RUN command -v python > /dev/null || ln -s "$(command -v python3)" /usr/local/bin/python

# Run as an unprivileged user; caches (Hugging Face, vLLM, Triton) go under its home.
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/clef --shell /usr/sbin/nologin clef
ENV HOME=/home/clef
USER 10001:10001
WORKDIR /home/clef

EXPOSE 8080
# KServe (or the operator's InferenceService) passes the arguments: --model-dir, --model-name, ...
ENTRYPOINT ["python", "-m", "predictor"]
