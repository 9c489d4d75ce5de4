"""The inventory of a Kubernetes CPod, from a watch-based cache of its Nodes and Pods.

The cache lists Nodes and Pods once (in pages), then follows each with a watch from the list's
resourceVersion; a watch that ends is resumed from the last resourceVersion seen (bookmarks keep it
fresh), and only a ``410 Gone`` (the version fell out of the API server's window) costs a new list.
A heartbeat reads the cache: ``nodes()`` does no API call.

What is kept is a few fields per object, not the objects: per node its GPU labels, allocatable
resources, Ready condition and cordon; per pod that holds GPUs, its node and GPU count. Pods that have
ended (Succeeded, Failed) hold none; the pod watch leaves them out with a field selector.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from sxwl.protocol import GpuInfo, Node

log = logging.getLogger("sxwl.agent.kubernetes.inventory")

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
DRIVER_LABELS = ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev")
CUDA_LABELS = ("nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor")
UNKNOWN_PRODUCT = "NVIDIA-GPU"
# Pods that ended hold no resources; the API server filters them out of list and watch.
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
LIST_PAGE = 500
WATCH_TIMEOUT_S = (240, 300)  # the server ends each watch within this (randomised: no herd)
RETRY_S = 5.0
MIB = 1024 * 1024

_SUFFIXES: dict[str, Decimal] = {
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate(("k", "M", "G", "T", "P", "E"))},
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
}


def parse_quantity(value: str | int | float | None) -> Decimal:
    """A Kubernetes resource quantity (``64``, ``500m``, ``512Gi``, ``1e3``) as a number; 0 if absent
    or malformed."""
    if value is None:
        return Decimal(0)
    text = str(value).strip()
    for suffix in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"):
        if text.endswith(suffix):
            try:
                return Decimal(text[: -len(suffix)]) * _SUFFIXES[suffix]
            except InvalidOperation:
                break
    try:
        return Decimal(text)
    except InvalidOperation:
        return Decimal(0)


@dataclass(frozen=True)
class NodeFacts:
    name: str
    ready: bool
    unschedulable: bool
    cpu_cores: int
    memory_mib: int
    gpus: int  # allocatable nvidia.com/gpu; 0 if the node has none
    has_gpu_resource: bool
    product: str | None
    gpu_memory_mib: int
    driver: str | None
    cuda: str | None


def _version(labels: dict[str, str], keys: Iterable[str]) -> str | None:
    parts = [labels.get(key) for key in keys]
    present = [p for p in parts if p]
    return ".".join(present) if present and parts[0] else None


def node_facts(raw: dict[str, Any]) -> NodeFacts:
    """The fields of a Node (as the API's JSON) that the inventory reports."""
    metadata = raw.get("metadata") or {}
    labels: dict[str, str] = metadata.get("labels") or {}
    status = raw.get("status") or {}
    allocatable: dict[str, str] = status.get("allocatable") or {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    try:
        gpu_memory = int(labels.get(MEMORY_LABEL, "0"))
    except ValueError:
        gpu_memory = 0
    return NodeFacts(
        name=metadata.get("name", ""),
        ready=ready,
        unschedulable=bool((raw.get("spec") or {}).get("unschedulable")),
        cpu_cores=int(parse_quantity(allocatable.get("cpu"))),
        memory_mib=int(parse_quantity(allocatable.get("memory")) // MIB),
        gpus=int(parse_quantity(allocatable.get(GPU_RESOURCE))),
        has_gpu_resource=GPU_RESOURCE in allocatable or GPU_RESOURCE in (status.get("capacity") or {}),
        product=labels.get(PRODUCT_LABEL),
        gpu_memory_mib=max(gpu_memory, 0),
        driver=_version(labels, DRIVER_LABELS),
        cuda=_version(labels, CUDA_LABELS),
    )


def _container_gpus(container: dict[str, Any]) -> int:
    resources = container.get("resources") or {}
    # Extended resources: requests equal limits, and a limit alone implies the request.
    value = (resources.get("requests") or {}).get(GPU_RESOURCE)
    if value is None:
        value = (resources.get("limits") or {}).get(GPU_RESOURCE)
    return int(parse_quantity(value))


def pod_gpus(raw: dict[str, Any]) -> tuple[str | None, int]:
    """(node the pod is bound to, GPUs it holds) for a pod as the API's JSON; 0 GPUs once it ended.
    A pod holds the larger of its containers' sum and its largest init container, as the scheduler
    counts it."""
    spec = raw.get("spec") or {}
    phase = (raw.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        return spec.get("nodeName"), 0
    regular = sum(_container_gpus(c) for c in spec.get("containers") or [])
    init = max((_container_gpus(c) for c in spec.get("initContainers") or []), default=0)
    return spec.get("nodeName"), max(regular, init)


def to_node(facts: NodeFacts, used: int) -> Node:
    gpu: GpuInfo | None = None
    if facts.has_gpu_resource and (facts.gpus > 0 or facts.product):
        count = facts.gpus
        gpu = GpuInfo(
            vendor="nvidia",
            product=facts.product or UNKNOWN_PRODUCT,
            memory_mib=facts.gpu_memory_mib,
            count=count,
            # Nothing new lands on a cordoned or not-ready node.
            allocatable=count if facts.ready and not facts.unschedulable else 0,
            used=min(used, count),
            driver=facts.driver,
            cuda=facts.cuda,
        )
    return Node(
        name=facts.name,
        status="ready" if facts.ready else "not_ready",
        cpu_cores=facts.cpu_cores,
        memory_mib=facts.memory_mib,
        gpu=gpu,
    )


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class _Cache:
    """One resource kind: list, then watch; ``apply`` is told of every object and deletion."""

    def __init__(
        self,
        kind: str,
        list_call: Callable[..., Any],
        on_reset: Callable[[], None],
        on_object: Callable[[dict[str, Any]], None],
        on_delete: Callable[[dict[str, Any]], None],
        field_selector: str | None = None,
    ) -> None:
        self.kind = kind
        self.list_call = list_call
        self.on_reset = on_reset
        self.on_object = on_object
        self.on_delete = on_delete
        self.field_selector = field_selector
        self.resource_version = ""
        self.lists = 0  # how many full lists: one, unless the API server said 410
        self.events = 0

    def _kwargs(self) -> dict[str, Any]:
        return {"field_selector": self.field_selector} if self.field_selector else {}

    async def list(self) -> None:
        """A full list, in pages; replaces what the cache held."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs = self._kwargs()
            if token:
                kwargs["_continue"] = token
            response = await self.list_call(limit=LIST_PAGE, _preload_content=False, **kwargs)
            try:
                page = json.loads(await response.read())
            finally:
                response.release()
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                self.resource_version = page["metadata"]["resourceVersion"]
                break
        self.on_reset()
        for item in items:
            self.on_object(item)
        self.lists += 1
        log.debug("listed %d %s at resourceVersion %s", len(items), self.kind, self.resource_version)

    async def watch_once(self) -> None:
        """One watch request, from the last resourceVersion, until the server ends it."""
        response = await self.list_call(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=random.randint(*WATCH_TIMEOUT_S),  # noqa: S311 - spreading, not secrecy
            _request_timeout=(10, WATCH_TIMEOUT_S[1] + 60),
            _preload_content=False,
            **self._kwargs(),
        )
        try:
            while True:
                line = await response.content.readline()
                if not line:
                    return
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone(obj.get("message", "410 Gone"))
                    raise ApiException(status=obj.get("code", 500), reason=obj.get("message", ""))
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if kind in ("ADDED", "MODIFIED"):
                    self.on_object(obj)
                elif kind == "DELETED":
                    self.on_delete(obj)
                self.events += kind != "BOOKMARK"
                if version:
                    self.resource_version = version
        finally:
            response.release()

    async def follow(self) -> None:
        """Watches for ever: resumes ended watches, lists again after a 410, retries failures."""
        while True:
            try:
                await self.watch_once()
            except asyncio.CancelledError:
                raise
            except _Gone as exc:
                log.info("%s watch expired (%s); listing again", self.kind, exc)
                await self._relist()
            except ApiException as exc:
                if exc.status == 410:
                    log.info("%s watch expired; listing again", self.kind)
                    await self._relist()
                else:
                    log.warning("%s watch failed (%s); retrying in %.0f s", self.kind, exc, RETRY_S)
                    await asyncio.sleep(RETRY_S)
            except Exception as exc:
                log.warning("%s watch broke (%r); retrying in %.0f s", self.kind, exc, RETRY_S)
                await asyncio.sleep(RETRY_S)

    async def _relist(self) -> None:
        while True:
            try:
                await self.list()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("listing %s failed (%r); retrying in %.0f s", self.kind, exc, RETRY_S)
                await asyncio.sleep(RETRY_S)


def _pod_key(raw: dict[str, Any]) -> str:
    metadata = raw.get("metadata") or {}
    return str(metadata.get("uid") or f"{metadata.get('namespace')}/{metadata.get('name')}")


class KubernetesInventory:
    """Nodes of a Kubernetes CPod, kept current by watches. ``await start()`` lists Nodes and Pods
    once (so the first heartbeat is complete) and starts the watches; ``close()`` stops them."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api
        core = client.CoreV1Api(api)
        self._nodes: dict[str, NodeFacts] = {}
        self._pods: dict[str, tuple[str, int]] = {}  # pod uid -> (node, GPUs), only pods holding GPUs
        self._used: dict[str, int] = {}  # node -> GPUs held by its live pods
        self.node_cache = _Cache("nodes", core.list_node, self._nodes.clear, self._put_node, self._drop_node)
        self.pod_cache = _Cache(
            "pods",
            core.list_pod_for_all_namespaces,
            self._reset_pods,
            self._put_pod,
            self._drop_pod,
            field_selector=LIVE_PODS,
        )
        self._tasks: list[asyncio.Task[None]] = []

    # -- the cache --

    def _put_node(self, raw: dict[str, Any]) -> None:
        facts = node_facts(raw)
        self._nodes[facts.name] = facts

    def _drop_node(self, raw: dict[str, Any]) -> None:
        self._nodes.pop((raw.get("metadata") or {}).get("name", ""), None)

    def _reset_pods(self) -> None:
        self._pods.clear()
        self._used.clear()

    def _drop_pod(self, raw: dict[str, Any]) -> None:
        old = self._pods.pop(_pod_key(raw), None)
        if old is not None:
            node, gpus = old
            left = self._used.get(node, 0) - gpus
            if left > 0:
                self._used[node] = left
            else:
                self._used.pop(node, None)

    def _put_pod(self, raw: dict[str, Any]) -> None:
        self._drop_pod(raw)
        node, gpus = pod_gpus(raw)
        if node and gpus > 0:
            self._pods[_pod_key(raw)] = (node, gpus)
            self._used[node] = self._used.get(node, 0) + gpus

    # -- the agent's interface --

    async def start(self) -> None:
        """Lists Nodes and Pods (the first heartbeat is complete), then follows them."""
        await self.node_cache.list()
        await self.pod_cache.list()
        await self.start_watches()
        log.info("inventory: %d nodes, %d pods holding GPUs; watching", len(self._nodes), len(self._pods))

    async def start_watches(self) -> None:
        self._tasks = [
            asyncio.create_task(self.node_cache.follow(), name="watch-nodes"),
            asyncio.create_task(self.pod_cache.follow(), name="watch-pods"),
        ]

    def nodes(self) -> list[Node]:
        return [to_node(facts, self._used.get(name, 0)) for name, facts in sorted(self._nodes.items())]

    def gpu_indexes(self) -> list[int]:
        return []  # GPUs on Kubernetes are the device plugin's to hand out, not ours

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks = []

    async def aclose(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def cluster_uid(api: ApiClient) -> str:
    """The uid of the ``kube-system`` namespace: fixed for the cluster's life, the same for every
    replica of the agent."""
    namespace = await client.CoreV1Api(api).read_namespace("kube-system")
    return str(namespace.metadata.uid)
