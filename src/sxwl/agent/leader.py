"""Leader election through a ``coordination.k8s.io`` Lease, for more than one agent replica per
Kubernetes CPod: only the leader registers, heartbeats and runs jobs; the others wait.

The rules are client-go's: a candidate takes the Lease when it does not exist, is held by nobody,
or its holder has not renewed it for ``leaseDurationSeconds``; every write carries the
resourceVersion it read, so two candidates never both win. The leader renews every ``retry_s``;
one that cannot renew within ``renew_deadline_s`` has lost (``LeadershipLost``) and must stop its
work at once — the agent exits, its pod restarts and becomes a candidate again. On a clean stop the
leader releases the Lease so a follower takes over without waiting for it to expire.

Needs, in the agent's namespace: leases get, create, update.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import socket
import time
import uuid
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger("sxwl.agent.leader")

LEASE_NAME = "sxwl-agent-leader"


class LeadershipLost(Exception):
    """The Lease went to another replica or could not be renewed in time."""


def default_identity() -> str:
    """The pod's name (unique among live pods) plus a random part (a restarted container is another
    candidate)."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _micro_time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class LeaseElector:
    def __init__(
        self,
        api: Any,
        namespace: str,
        identity: str | None = None,
        name: str = LEASE_NAME,
        lease_duration_s: int = 15,
        renew_deadline_s: float = 10.0,
        retry_s: float = 2.0,
    ) -> None:
        self.coordination = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_s = retry_s
        self.leading = False
        self._last_renew = 0.0

    def _spec(self, transitions: int, acquire: datetime.datetime) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_duration_s,
            "acquireTime": _micro_time(acquire),
            "renewTime": _micro_time(_now()),
            "leaseTransitions": transitions,
        }

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this candidate holds the Lease afterwards."""
        try:
            lease = await self.coordination.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("reading Lease %s/%s failed: %s", self.namespace, self.name, exc.reason)
                return False
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(0, _now()),
            }
            try:
                await self.coordination.create_namespaced_lease(self.namespace, body)
            except ApiException as create_exc:
                if create_exc.status != 409:  # 409: another candidate created it first
                    log.warning(
                        "creating Lease %s/%s failed: %s", self.namespace, self.name, create_exc.reason
                    )
                return False
            return True
        spec = lease.spec
        holder = spec.holder_identity or ""
        mine = holder == self.identity
        if holder and not mine:
            renewed = spec.renew_time or spec.acquire_time
            duration = spec.lease_duration_seconds or self.lease_duration_s
            if renewed is not None:
                if renewed.tzinfo is None:
                    renewed = renewed.replace(tzinfo=datetime.UTC)
                if _now() < renewed + datetime.timedelta(seconds=duration):
                    return False  # held, and not expired
        transitions = (spec.lease_transitions or 0) + (0 if mine else 1)
        acquired = spec.acquire_time if mine and spec.acquire_time is not None else _now()
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": lease.metadata.resource_version,
            },
            "spec": self._spec(transitions, acquired),
        }
        try:
            await self.coordination.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as exc:
            if exc.status != 409:  # 409: somebody wrote it since we read it
                log.warning("updating Lease %s/%s failed: %s", self.namespace, self.name, exc.reason)
            return False
        return True

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Waits until this candidate leads (True) or ``stop`` is set (False)."""
        logged = False
        while not stop.is_set():
            if await self.try_acquire_or_renew():
                self.leading = True
                self._last_renew = time.monotonic()
                log.info("leading as %s (Lease %s/%s)", self.identity, self.namespace, self.name)
                return True
            if not logged:
                log.info("another replica leads (Lease %s/%s); standing by", self.namespace, self.name)
                logged = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.retry_s)
        return False

    async def keep(self) -> None:
        """Renews for as long as it can; raises LeadershipLost when it cannot."""
        while True:
            await asyncio.sleep(self.retry_s)
            if await self.try_acquire_or_renew():
                self._last_renew = time.monotonic()
            elif time.monotonic() - self._last_renew > self.renew_deadline_s:
                self.leading = False
                raise LeadershipLost(f"could not renew Lease {self.namespace}/{self.name} in time")

    async def release(self) -> None:
        """Gives the Lease up (if still held) so that a follower takes over at once."""
        if not self.leading:
            return
        self.leading = False
        try:
            lease = await self.coordination.read_namespaced_lease(self.name, self.namespace)
            if lease.spec.holder_identity != self.identity:
                return
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "resourceVersion": lease.metadata.resource_version,
                },
                "spec": {
                    "leaseDurationSeconds": 1,
                    "renewTime": _micro_time(_now()),
                    "leaseTransitions": lease.spec.lease_transitions or 0,
                },
            }
            await self.coordination.replace_namespaced_lease(self.name, self.namespace, body)
            log.info("released Lease %s/%s", self.namespace, self.name)
        except Exception as exc:
            log.warning(
                "releasing Lease %s/%s failed (%r); it expires by itself", self.namespace, self.name, exc
            )
