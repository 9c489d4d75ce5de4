"""The agent protocol's paths, named once for the agent's client and the cloud's routes. Routes are
declared relative to ``AGENT`` (the router's prefix) in Starlette's template syntax; ``url`` fills a
template in for the client."""

from __future__ import annotations

import re
from urllib.parse import quote

API = "/api/v1"
AGENT = "/agent"

REGISTER = "/register"
ISOLATION = "/isolation"
ACCESS_KEY_CHECK = "/access-key/check"
HEARTBEAT = "/heartbeat"
ASSIGNMENTS = "/assignments"
COMMAND_ACK = "/commands/{command_id}/ack"
JOB_STATUS = "/jobs/{job_id}/status"
JOB_LOGS = "/jobs/{job_id}/logs"
JOB_ARTIFACT = "/jobs/{job_id}/artifacts/{path:path}"
# One of an attempt's inputs (a model, a dataset, a checkpoint: docs/finetune.md), the attempt in the query.
JOB_INPUT = "/jobs/{job_id}/inputs/{name}"
# An artifact put by a Kubernetes pod's uploader with its attempt's upload token, not the CPod token.
UPLOAD_ARTIFACT = "/uploads/{job_id}/{attempt}/{path:path}"
# Uploads straight to the object store (docs/object-storage.md): where to put an artifact's bytes,
# then that they are there; with the CPod token (the attempt in the query) or a pod's upload token.
UPLOAD_TARGET = "/jobs/{job_id}/upload-targets"
UPLOAD_DONE = "/jobs/{job_id}/upload-targets/done"
POD_UPLOAD_TARGET = "/upload-targets/{job_id}/{attempt}"
POD_UPLOAD_DONE = "/upload-targets/{job_id}/{attempt}/done"
# One of an attempt's inputs fetched by its Kubernetes pod (the init container, sxwl.agent.pod_fetcher)
# with the attempt's upload token, not the CPod token.
POD_INPUT = "/pod-inputs/{job_id}/{attempt}/{name}"

# The agent's tunnel: a WebSocket carrying HTTP/2, on which the cloud opens streams (docs/tunnel.md).
TUNNEL = "/tunnel"

_CONVERTER = re.compile(r"\{(\w+):\w+\}")


def url(template: str, **values: str | int) -> str:
    """The path from the cloud's root, each value quoted (``/`` kept, as artifact paths need it)."""
    filled = _CONVERTER.sub(r"{\1}", template).format(**{k: quote(str(v)) for k, v in values.items()})
    return API + AGENT + filled
