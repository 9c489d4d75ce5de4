# syntax=docker/dockerfile:1
# The sxwl-agent image for Kubernetes CPods (deploy/helm/sxwl-agent runs it with --runtime kubernetes).
#
#   docker build -f deploy/docker/agent.Dockerfile -t sxwl-agent:0.1.0 .
#
# Stage 1 builds the project's wheel and installs it, with its pinned dependencies, into a virtual
# environment; stage 2 copies only that environment onto a slim Python and runs as UID 10001.
# (Not built in this project's CI: its machine has no Docker engine. See docs/agent.md.)

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m venv /opt/sxwl \
 && /opt/sxwl/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/sxwl/bin/pip install /wheels/sxwl-*.whl \
 && find /opt/sxwl -name '__pycache__' -prune -exec rm -rf {} + \
 && rm -rf /opt/sxwl/lib/python*/site-packages/pip /opt/sxwl/lib/python*/site-packages/pip-*

FROM python:${PYTHON_VERSION}-slim-bookworm
LABEL org.opencontainers.image.title="sxwl-agent" \
      org.opencontainers.image.description="算想云 agent of a CPod" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 sxwl \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin sxwl
COPY --from=build /opt/sxwl /opt/sxwl
ENV PATH=/opt/sxwl/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["sxwl-agent"]
CMD ["--runtime", "kubernetes"]
