# syntax=docker/dockerfile:1
# The sxwl cloud's image (deploy/helm/sxwl-cloud runs it as `sxwl serve --host 0.0.0.0`).
#
#   docker build -f deploy/docker/cloud.Dockerfile -t sxwl-cloud:0.1.0 .
#
# Stage 1 builds the project's wheel and installs it, with its pinned dependencies, into a virtual
# environment; stage 2 copies only that environment onto a slim Python and runs as UID 10001, with
# a read-only root filesystem in the chart (/tmp and the data dir are emptyDirs there).
# (Not built in this project's CI: its machine has no Docker engine. tests/k8s/test_cloud_chart.py
# runs the chart with an image of the same packages built offline: tests/support/cloud_image.py.)

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m venv /opt/sxwl \
 && /opt/sxwl/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/sxwl/bin/pip install /wheels/sxwl-*.whl \
 && /opt/sxwl/bin/python -m compileall -q /opt/sxwl/lib \
 && rm -rf /opt/sxwl/lib/python*/site-packages/pip /opt/sxwl/lib/python*/site-packages/pip-*

FROM python:${PYTHON_VERSION}-slim-bookworm
LABEL org.opencontainers.image.title="sxwl-cloud" \
      org.opencontainers.image.description="算想云 cloud: API, console and scheduler" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 sxwl \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin sxwl \
 && install -d -o 10001 -g 10001 -m 0700 /var/lib/sxwl
COPY --from=build /opt/sxwl /opt/sxwl
# The root filesystem is read-only in the chart: the bytecode is compiled at build time instead.
ENV PATH=/opt/sxwl/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 SXWL_DATA_DIR=/var/lib/sxwl
USER 10001:10001
WORKDIR /var/lib/sxwl
EXPOSE 8000
ENTRYPOINT ["sxwl"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
