"""What the ``kubernetes`` runtime adds to every tenant pod, from the agent's flags: where the pods'
uploaders send artifacts, the images that run fine-tunes and endpoint replicas, the agent's own pods'
labels (a replica's NetworkPolicy admits only them), where fine-tunes' pods find the agent's input
cache, and the provider's node selector and tolerations (docs/agent.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# A label or taint key: an optional DNS prefix and a name (what Kubernetes validates, roughly).
_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


@dataclass(frozen=True)
class PodSettings:
    upload_url: str
    uploader_image: str | None = None
    trainer_image: str | None = None  # runs fine-tunes (kube_inputs.py); None: the CPod takes none
    engine_image: str | None = None  # runs endpoint replicas (kube_engine.py); None: the CPod serves none
    agent_labels: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    dev_env_image: str | None = None  # runs dev environments (kube_devenv.py); None: the CPod runs none
    workspace_storage_class: str | None = None  # of their workspaces' claims; None: the cluster's default
    workspace_size: str = "20Gi"
    upload_ca: bytes | None = None
    node_selector: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    tolerations: tuple[dict[str, str], ...] = field(default_factory=tuple)
    memory_limit: str | None = None  # a Kubernetes quantity, e.g. "16Gi"
    inputs_url: str | None = None  # the agent's input cache as pods reach it (--serve-inputs)


def _key_value(text: str, what: str) -> tuple[str, str | None]:
    key, equals, value = text.partition("=")
    if not _KEY.match(key) or len(key) > 316:
        raise ValueError(f"{key!r} is not a {what} key")
    if equals and (not _VALUE.match(value) or len(value) > 63):
        raise ValueError(f"{value!r} is not a {what} value")
    return key, value if equals else None


def node_selector(text: str) -> tuple[str, str]:
    """``KEY=VALUE``: a node label every tenant pod requires."""
    key, value = _key_value(text, "label")
    if value is None:
        raise ValueError("expected KEY=VALUE")
    return key, value


def toleration(text: str) -> dict[str, str]:
    """``KEY[=VALUE]:EFFECT``: a taint every tenant pod tolerates (any value when none is given)."""
    spec, colon, effect = text.rpartition(":")
    if not colon or effect not in EFFECTS:
        raise ValueError(f"expected KEY[=VALUE]:EFFECT with EFFECT one of {', '.join(EFFECTS)}")
    key, value = _key_value(spec, "taint")
    if value is None:
        return {"key": key, "operator": "Exists", "effect": effect}
    return {"key": key, "operator": "Equal", "value": value, "effect": effect}


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::]:8471`` for IPv6): where the agent serves its input cache."""
    host, colon, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected HOST:PORT, e.g. 0.0.0.0:8471")
    return host, int(port)


_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")


def memory_quantity(text: str) -> str:
    """A memory size as Kubernetes writes it (``512Mi``, ``16Gi``, ``2G``, bytes without a suffix)."""
    if not _QUANTITY.fullmatch(text) or float(re.sub(r"[A-Za-z]+$", "", text)) <= 0:
        raise ValueError("expected a positive size such as 512Mi or 16Gi")
    return text
