# The clef-serving predictor (KServe model server + vLLM plugin) on the official vLLM image, which
# brings CUDA, PyTorch and vLLM. Build from the repository root:
#   docker build -f docker/predictor.Dockerfile -t clef-predictor:0.1.0 .
FROM vllm/vllm-openai:v0.26.0

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/clef-serving
COPY pyproject.toml README.md ./
COPY clef_head/ clef_head/
COPY clef_plugin/ clef_plugin/
COPY predictor/ predictor/
COPY operator/clef_operator/ operator/clef_operator/

# Every package already in the image (vLLM, PyTorch, the CUDA libraries) is pinned as a constraint,
# so installing the `serve` and `vllm` extras only adds what is missing: a dependency that would
# replace one of them fails the build instead of silently swapping the GPU stack.
RUN python3 -m pip list --format=freeze > /tmp/image-constraints.txt \
    && python3 -m pip install --no-cache-dir --constraint /tmp/image-constraints.txt ".[serve,vllm]" \
    && rm /tmp/image-constraints.txt

# The operator's InferenceServices start the predictor as `python -m predictor`.
RUN command -v python > /dev/null || ln -s "$(command -v python3)" /usr/local/bin/python

# Run as an unprivileged user; caches (Hugging Face, vLLM, Triton) go under its home.
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/clef --shell /usr/sbin/nologin clef
ENV HOME=/home/clef
USER 10001:10001

EXPOSE 8080
# KServe (or the operator's InferenceService) passes the arguments: --model-dir, --model-name, ...
ENTRYPOINT ["python", "-m", "predictor"]
