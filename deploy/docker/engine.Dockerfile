# syntax=docker/dockerfile:1
# The image that runs endpoint replicas on Kubernetes CPods (docs/agent.md, "Endpoints on
# Kubernetes"; the chart's jobs.engineImage): the engine's supervisor (`python3 -m sxwl.engine`,
# given its run in SXWL_ENGINE_RUN by the agent's pod) and an engine:
#
#   docker build -f deploy/docker/engine.Dockerfile -t sxwl-engine:0.1.0 .                    # vLLM, GPUs
#   docker build -f deploy/docker/engine.Dockerfile --build-arg ENGINE=cpu -t sxwl-engine-cpu:0.1.0 .
#
# ENGINE=vllm installs vLLM at the version the agent asks for (protocol/endpoints.py: VLLM_VERSION)
# with the torch and transformers it pins itself, apart from the training stack's (whose torch it
# would not accept); a replica with GPUs runs `vllm serve`. ENGINE=cpu installs the `train` extra and
# transformers' `serving` extra: a replica without GPUs runs `transformers serve` on the node's CPUs.
# (Not built in this project's CI: its machine has no Docker engine; the tests' real node runs the
# same supervisor from an image made of the test venv's packages, tests/support/k8s_engine.py.)

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ARG ENGINE=vllm
ARG VLLM_VERSION=0.11.0
ARG TRANSFORMERS_VERSION=5.24.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m venv /opt/sxwl \
 && /opt/sxwl/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && WHEEL=$(ls /wheels/sxwl-*.whl) \
 && if [ "$ENGINE" = vllm ]; then \
      /opt/sxwl/bin/pip install "${WHEEL}" "vllm==${VLLM_VERSION}"; \
    else \
      /opt/sxwl/bin/pip install "${WHEEL}[train]" "transformers[serving]==${TRANSFORMERS_VERSION}"; \
    fi \
 && find /opt/sxwl -name '__pycache__' -prune -exec rm -rf {} + \
 && rm -rf /opt/sxwl/lib/python*/site-packages/pip /opt/sxwl/lib/python*/site-packages/pip-*

FROM python:${PYTHON_VERSION}-slim-bookworm
LABEL org.opencontainers.image.title="sxwl-engine" \
      org.opencontainers.image.description="算想云 inference engine (vLLM, or transformers serve on CPUs) under its supervisor" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 sxwl \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin sxwl
COPY --from=build /opt/sxwl /opt/sxwl
ENV PATH=/opt/sxwl/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
USER 10001:10001
WORKDIR /tmp
CMD ["python3", "-m", "sxwl.engine"]
