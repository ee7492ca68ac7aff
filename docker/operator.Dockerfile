# The clef-serving operator (kopf): a small Python image without the model stack. Build from the
# repository root:
#   docker build -f docker/operator.Dockerfile -t clef-operator:0.1.0 .
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/clef-serving
COPY pyproject.toml README.md ./
COPY clef_head/ clef_head/
COPY clef_plugin/ clef_plugin/
COPY predictor/ predictor/
COPY operator/clef_operator/ operator/clef_operator/

# Only the `operator` extra's requirements (read from pyproject.toml, the one list of them), then the
# package itself without the model stack (torch, transformers) that the operator never imports.
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['operator']))" > /tmp/operator-requirements.txt \
    && pip install --no-cache-dir --requirement /tmp/operator-requirements.txt \
    && pip install --no-cache-dir --no-deps . \
    && rm /tmp/operator-requirements.txt

RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin clef
USER 10001:10001

EXPOSE 8080
ENTRYPOINT ["python", "-m", "clef_operator"]
CMD ["--all-namespaces", "--liveness-port", "8080"]
