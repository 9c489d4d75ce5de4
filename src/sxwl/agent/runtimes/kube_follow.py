"""The logs of pods a stop is about to delete, followed as they are written.

Pods that end on their own stay in the cluster until the agent deletes their Job, and the passes of
kube_logs.py read their logs in time. A pod that a stop deletes does not: once its containers have
stopped, the kubelet removes them, and their logs with them, at once (a finalizer keeps the pod
object but not its containers). So before it deletes them, the runtime opens a ``follow=true``
stream of each started pod's log; the kubelet ends the stream when the container has ended, after
its last line, and every line goes into the spool as it comes. Until those streams have ended, the
attempt is not over (``busy``), so the final state reaches the cloud after the lines the script
printed on SIGTERM."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from sxwl.agent.runtimes.kube_logs import ship, since_kwargs, started
from sxwl.agent.runtimes.kube_objects import API_ERRORS, KubeJob, short

log = logging.getLogger("sxwl.agent.kubernetes")

OPEN_TIMEOUT_S = 5.0


class LogFollowers:
    """One streaming task per followed pod; the passes leave those pods to it."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self._tasks: dict[str, tuple[str, asyncio.Task[None]]] = {}  # pod name -> (job key, task)
        self._changed: set[str] = set()  # job keys whose record the streams changed

    async def start(self, job: KubeJob, pods: list[Any], spool: Path) -> None:
        """Opens the streams, and returns once the kubelet has answered each (or ``OPEN_TIMEOUT_S``
        has passed): a stream opened after the delete might find the containers gone."""
        for pod in pods:
            name = pod.metadata.name
            if not started(pod) or name in self._tasks:
                continue
            try:
                response = await asyncio.wait_for(
                    self.core.read_namespaced_pod_log(
                        name,
                        pod.metadata.namespace,
                        follow=True,
                        _preload_content=False,
                        **since_kwargs(job, pod),
                    ),
                    OPEN_TIMEOUT_S,
                )
            except API_ERRORS as exc:
                log.info("could not follow the log of pod %s; reading it by passes: %s", name, short(exc))
                continue
            if not 200 <= response.status <= 299:  # unread, a stream's answer is not checked for us
                log.info("could not follow the log of pod %s: %s", name, response.status)
                response.release()
                continue
            self._tasks[name] = (job.key, asyncio.create_task(self._drain(job, pod, response, spool)))

    def owns(self, pod: Any) -> bool:
        return pod.metadata.name in self._tasks

    def busy(self, key: str) -> bool:
        """A stream of the attempt is still open."""
        return any(k == key and not task.done() for k, task in self._tasks.values())

    def take_changed(self) -> set[str]:
        changed, self._changed = self._changed, set()
        return changed

    def forget(self, key: str) -> None:
        """The attempt is over: its streams, if any are left, are closed."""
        for name, (k, task) in list(self._tasks.items()):
            if k == key:
                task.cancel()
                del self._tasks[name]

    async def _drain(self, job: KubeJob, pod: Any, response: Any, spool: Path) -> None:
        try:
            rest = b""
            async for chunk in response.content.iter_any():
                data = rest + chunk
                cut = data.rfind(b"\n") + 1  # whole lines only: a newline never splits a character
                if cut and ship(job, pod, data[:cut].decode(errors="replace"), spool):
                    self._changed.add(job.key)
                rest = data[cut:]
            if rest and ship(job, pod, rest.decode(errors="replace"), spool):
                self._changed.add(job.key)
        except API_ERRORS as exc:
            log.info("the log of pod %s broke off: %s", pod.metadata.name, short(exc))
        finally:
            response.release()
