# The clef-serving operator (kopf): its own distribution (operator/pyproject.toml), without the model stack.
# Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t clef-operator:0.1.0 .
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Installed like any distribution (not editable); the sources are removed so nothing imports from them.
COPY operator/ /tmp/clef-serving-operator/
RUN pip install --no-cache-dir /tmp/clef-serving-operator \
    && rm -rf /tmp/clef-serving-operator

RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin clef
USER 10001:10001
WORKDIR /tmp

EXPOSE 8080
ENTRYPOINT ["python", "-m", "clef_operator"]
CMD ["--all-namespaces", "--liveness-port", "8080"]
