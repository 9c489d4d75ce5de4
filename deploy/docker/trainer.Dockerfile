# syntax=docker/dockerfile:1
# The image that runs fine-tunes on Kubernetes CPods: the project with its `train` extra (torch,
# transformers, peft, pinned in pyproject.toml), started as `python3 -m sxwl.trainer RUN_JSON` by the
# agent's pods (docs/agent.md, "Fine-tunes on Kubernetes"; the chart's jobs.trainerImage). With the
# `devenv` extra (JupyterLab, pinned) and OpenSSH's sshd it also runs dev environments (docs/dev-envs.md,
# "On Kubernetes"; the chart's devEnvs.image defaults to it).
#
#   docker build -f deploy/docker/trainer.Dockerfile -t sxwl-trainer:0.1.0 .
#
# torch from PyPI is its CUDA build, so the image drives NVIDIA GPUs through the device plugin's
# driver mounts; it is about 7 GB. (Not built in this project's CI: its machine has no Docker engine;
# the tests' real node runs the same trainer from an image made of the test venv's packages.)

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m venv /opt/sxwl \
 && /opt/sxwl/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && WHEEL=$(ls /wheels/sxwl-*.whl) \
 && /opt/sxwl/bin/pip install "${WHEEL}[train,devenv]" \
 && find /opt/sxwl -name '__pycache__' -prune -exec rm -rf {} + \
 && rm -rf /opt/sxwl/lib/python*/site-packages/pip /opt/sxwl/lib/python*/site-packages/pip-*

FROM python:${PYTHON_VERSION}-slim-bookworm
LABEL org.opencontainers.image.title="sxwl-trainer" \
      org.opencontainers.image.description="算想云 fine-tune trainer (transformers + peft LoRA)" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssh-server \
 && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_* \
 && groupadd --system --gid 10001 sxwl \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin sxwl
COPY --from=build /opt/sxwl /opt/sxwl
ENV PATH=/opt/sxwl/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
USER 10001:10001
WORKDIR /tmp
CMD ["python3", "-m", "sxwl.trainer"]
