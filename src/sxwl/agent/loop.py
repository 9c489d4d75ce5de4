"""The agent's life: register once, then heartbeat, take work and run it until stopped or refused."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import sxwl
from sxwl.agent.client import CloudClient, Refused, Rejected, Unreachable
from sxwl.agent.engine_load import InFlight, Loads
from sxwl.agent.inputs import InputCache
from sxwl.agent.jobsync import JobSync
from sxwl.agent.runtimes.base import J, Runtime
from sxwl.agent.runtimes.sandbox import Isolation
from sxwl.agent.state import SavedRegistration, StateDir
from sxwl.agent.tunnel_client import NO_TUNNEL, TunnelClient, TunnelSettings
from sxwl.protocol import Heartbeat, IsolationReport, Node, RegisterRequest

if TYPE_CHECKING:  # uvicorn and starlette only where the agent serves its cache
    from sxwl.agent.cache_server import CacheServer

log = logging.getLogger("sxwl.agent")
T = TypeVar("T")

BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0
# Held by the cloud up to its SXWL_LONGPOLL_MAX_S, kept open meanwhile by its keep-alive newlines.
# Renewals were about a third of what an idle fleet cost the cloud (docs/replicas.md), and the hold
# bounds nothing else: heartbeats notice a revoked token within an interval.
LONG_POLL_S = 1200.0
# An answer with nothing in it sooner than this after asking did not wait for work: the cloud is
# stopping (it ends every hold at once, and answers at once until it stops accepting requests), or
# something between cut the hold. Asking again at once would spin (issue 25: twenty polls in 50 ms).
EARLY_EMPTY_S = 1.0
SUPERVISE_S = 0.5


class Inventory(Protocol):
    """What the agent reads its nodes from. An inventory that needs the event loop (the Kubernetes
    one watches the API server) also has ``async start()``, which the agent awaits before its first
    heartbeat; its ``nodes()`` then only reads a cache and runs in the loop, not in a thread."""

    def nodes(self) -> list[Node]: ...

    def gpu_indexes(self) -> list[int]: ...

    def close(self) -> None: ...


class TokenStore(Protocol):
    """Where the CPod token is kept: ``StateDir`` (a file) or ``SecretState`` (a Secret, awaited)."""

    def load(
        self, api_url: str, cluster_uid: str
    ) -> SavedRegistration | Awaitable[SavedRegistration | None] | None: ...

    def save(self, registration: SavedRegistration) -> Awaitable[None] | None: ...


class Elector(Protocol):
    """Leader election (``sxwl.agent.leader.LeaseElector``)."""

    async def acquire(self, stop: asyncio.Event) -> bool: ...

    async def keep(self) -> None: ...

    async def release(self) -> None: ...


async def _resolved(value: T | Awaitable[T]) -> T:
    if inspect.isawaitable(value):
        return await value
    return value


@dataclass(frozen=True)
class AgentConfig:
    api_url: str
    access_key: str | None
    runtime: str
    state_dir: Path
    cluster_uid: str
    name: str | None = None
    heartbeat_interval_s: float | None = None
    stop_grace_s: float = 10.0
    # How local jobs are kept apart (``sandbox.detect``); None on Kubernetes, whose namespaces do it.
    isolation: Isolation | None = None
    trusted_accounts: tuple[str, ...] = ()  # whose jobs besides the provider's, without isolation
    input_cache_max_bytes: int | None = None  # the cap of fine-tunes' input cache; None: no cap
    input_cache_dir: Path | None = None  # where that cache is; None: the state dir's ``cache``
    # The tunnel on which the cloud reaches services here (docs/tunnel.md); no connections: none.
    tunnel: TunnelSettings = NO_TUNNEL

    def isolation_report(self) -> IsolationReport:
        isolated = self.isolation is None or self.isolation.isolated
        return IsolationReport(
            isolation="isolated" if isolated else "none", trusted_accounts=list(self.trusted_accounts)
        )


class Stopped(Exception):
    pass


def backoff_delay(failures: int, cap: float = BACKOFF_CAP_S) -> float:
    """Exponential with jitter: many CPods losing the cloud at once do not return in lockstep."""
    ceiling = min(cap, BACKOFF_BASE_S * 2 ** min(failures, 16))
    return random.uniform(ceiling / 2, ceiling)  # noqa: S311 - jitter, not cryptography


class Agent(Generic[J]):
    def __init__(
        self,
        config: AgentConfig,
        inventory: Inventory,
        client: CloudClient | None = None,
        *,
        runtime: Runtime[J],
        state: TokenStore | None = None,
        leader: Elector | None = None,
        cache_server: CacheServer | None = None,
    ) -> None:
        """``runtime`` runs the jobs, ``state`` keeps the CPod token (the state dir when not given),
        ``leader`` elects one replica of several (none: always leads), ``cache_server`` serves the
        input cache to a Kubernetes CPod's pods (none: each pod fetches its own from the cloud)."""
        self.cache_server = cache_server
        self.config = config
        self.inventory = inventory
        self.client = client or CloudClient(config.api_url)
        self.state: TokenStore = state if state is not None else StateDir(config.state_dir)
        self.runtime = runtime
        # Each engine's load for the heartbeat: its metrics, or the tunnel's streams to it counted.
        self.loads = Loads(InFlight())
        self.leader = leader
        self._inventory_in_loop = inspect.iscoroutinefunction(getattr(inventory, "start", None))
        self.stop_event = asyncio.Event()
        self.interval = config.heartbeat_interval_s or 10.0
        self.seq = 0

    def stop(self) -> None:
        self.stop_event.set()

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stop_event.wait(), timeout=seconds)
        except TimeoutError:
            return
        raise Stopped

    async def _retrying(self, what: str, call: Callable[[], Awaitable[T]], cap: float = BACKOFF_CAP_S) -> T:
        failures = 0
        while True:
            if self.stop_event.is_set():
                raise Stopped
            try:
                return await call()
            except Unreachable as exc:
                delay = backoff_delay(failures, cap)
                failures += 1
                log.warning(
                    "cloud %s unreachable during %s (%s); retrying in %.1f s",
                    self.config.api_url,
                    what,
                    exc,
                    delay,
                )
                await self._sleep(delay)

    async def registration(self) -> SavedRegistration:
        saved = await _resolved(self.state.load(self.config.api_url, self.config.cluster_uid))
        if saved is not None:
            log.info("using the saved token of CPod %s", saved.cpod_id)
            return saved
        if not self.config.access_key:
            raise Refused(
                "no saved CPod token: give the accessKey (--access-key or SXWL_ACCESS_KEY) to register",
                "no_access_key",
            )
        key = self.config.access_key
        request = RegisterRequest(
            **self._how_jobs_run().model_dump(),
            cluster_uid=self.config.cluster_uid,
            name=self.config.name,
            runtime="local" if self.config.runtime == "local" else "kubernetes",
            agent_version=sxwl.__version__,
            heartbeat_interval_s=self.config.heartbeat_interval_s,
        )
        reply = await self._retrying("registration", lambda: self.client.register(key, request))
        saved = SavedRegistration(
            self.config.api_url, reply.cpod_id, reply.cpod_token, self.config.cluster_uid
        )
        await _resolved(self.state.save(saved))
        self.interval = reply.heartbeat_interval_s
        self.seq = reply.last_seq
        log.info("registered as CPod %s; heartbeat every %.1f s", reply.cpod_id, self.interval)
        return saved

    async def report_isolation(self, token: str) -> None:
        """Tells the cloud how jobs run here (at every start: the mode may have changed since the
        registration) and learns whose jobs a runtime without isolation may start."""
        report = self._how_jobs_run()
        try:
            reply = await self._retrying("isolation report", lambda: self.client.isolation(token, report))
        except Rejected as exc:
            if report.isolation == "none":
                message = f"the cloud did not take this CPod's isolation report: {exc}"
                raise Refused(message, "rejected") from None
            log.warning("the cloud did not take the isolation report (%s); jobs stay isolated", exc)
            return
        if reply.accepted_owner_ids is not None:
            self.runtime.accept_owners(frozenset(reply.accepted_owner_ids))

    def _how_jobs_run(self) -> IsolationReport:
        runs = {
            "fine_tunes": self.runtime.takes_fine_tunes,
            "endpoints": self.runtime.takes_endpoints,
            "dev_envs": self.runtime.takes_dev_envs,
        }
        return self.config.isolation_report().model_copy(update=runs)

    def _nodes(self) -> list[Node]:
        return self.runtime.nodes_to_report(self.inventory.nodes())

    async def heartbeat_once(self, token: str, sync: JobSync[J]) -> None:
        # NVML can block; a watch cache is read in the loop that updates it.
        nodes = self._nodes() if self._inventory_in_loop else await asyncio.to_thread(self._nodes)
        for _ in range(2):
            self.seq += 1
            # The input cache only when it changed: the cloud keeps what an accepted beat said.
            cache = sync.cache_report()
            jobs = await self.loads.reported(sync.reports(), self.runtime)
            beat = Heartbeat(seq=self.seq, nodes=nodes, jobs=jobs, cache=cache)
            reply = await self._retrying(
                "heartbeat",
                partial(self.client.heartbeat, token, beat),
                # Retry at least once per interval, so a returning cloud hears from us in time.
                cap=max(self.interval, BACKOFF_BASE_S),
            )
            self.interval = reply.heartbeat_interval_s
            if reply.accepted:
                sync.cache_reported(cache)
                return
            # The cloud holds a newer sequence number (say, from before a restart): continue after it.
            self.seq = reply.last_seq

    async def _heartbeats(self, token: str, sync: JobSync[J]) -> None:
        while True:
            await self.heartbeat_once(token, sync)
            await self._sleep(self.interval)

    async def _assignments(self, token: str, sync: JobSync[J]) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            asked = loop.time()
            try:
                reply = await self.client.assignments(token, LONG_POLL_S)
                await sync.handle(reply)
            except (Unreachable, Rejected) as exc:
                delay = backoff_delay(failures)
                failures += 1
                log.warning("getting assignments failed (%s); retrying in %.1f s", exc, delay)
                await self._sleep(delay)
            else:
                if reply.assignments or reply.commands or loop.time() - asked >= EARLY_EMPTY_S:
                    failures = 0
                else:
                    # Backed off like a failure, but at least once per heartbeat interval: a cloud
                    # whose holds are short by configuration still hands out work in time.
                    delay = backoff_delay(failures, cap=max(self.interval, BACKOFF_BASE_S))
                    failures += 1
                    log.info("the long-poll ended at once with nothing; asking again in %.1f s", delay)
                    await self._sleep(delay)
            if self.stop_event.is_set():
                raise Stopped

    async def _supervise(self, sync: JobSync[J]) -> None:
        while True:
            try:
                await sync.supervise_once()
            except Unreachable as exc:
                log.warning("cloud unreachable while reporting jobs (%s); the jobs keep running", exc)
            await self._sleep(SUPERVISE_S)

    def _input_cache(self) -> InputCache | None:
        """Local CPods keep fine-tunes' inputs unpacked, for hard links into the attempts' dirs; a
        Kubernetes CPod that serves them keeps the files as they came (its pods unpack them), and
        one that does not has none: each pod fetches its own from the cloud."""
        if self.config.runtime != "local" and self.cache_server is None:
            return None
        root = self.config.input_cache_dir or self.config.state_dir / "cache"
        unpack = self.config.runtime == "local"
        return InputCache(root, self.client, self.config.input_cache_max_bytes, unpack_archives=unpack)

    async def run(self) -> None:
        """Returns when stopped; raises Refused when the cloud will not have this agent. Running jobs
        are left running on stop: a restarted agent takes them back."""
        keeper: asyncio.Task[None] | None = None
        try:
            # With several replicas only the leader works; a lost Lease ends run() with LeadershipLost.
            if self.leader is not None and not await self.leader.acquire(self.stop_event):
                raise Stopped
            # Renewing starts at once: the first list of a big cluster must not let the Lease expire.
            if self.leader is not None:
                keeper = asyncio.create_task(self.leader.keep(), name="leader")
            start = getattr(self.inventory, "start", None)
            if self._inventory_in_loop and start is not None:
                await start()
            saved = await self.registration()
            await self.report_isolation(saved.cpod_token)
            cache = self._input_cache()
            grants = self.cache_server.grants if self.cache_server is not None else None
            sync = JobSync(self.client, self.runtime, saved.cpod_token, cache, grants)
            sync.lost = await _resolved(self.runtime.adopt())
            await self._retrying("reports of unstarted attempts", sync.report_left_pending)
            tasks = [
                asyncio.create_task(self._heartbeats(saved.cpod_token, sync), name="heartbeats"),
                asyncio.create_task(self._assignments(saved.cpod_token, sync), name="assignments"),
                asyncio.create_task(self._supervise(sync), name="supervise"),
            ]
            if self.config.tunnel.connections > 0:
                # The runtime finds the attempts' own services (engines, dev environments).
                tunnel = TunnelClient(
                    self.config.api_url,
                    saved.cpod_token,
                    self.config.tunnel,
                    backoff_delay,
                    self.runtime.attempt_target,
                    in_flight=self.loads.in_flight,
                )
                tasks.append(asyncio.create_task(tunnel.run(), name="tunnel"))
            if self.cache_server is not None and cache is not None:
                serving = self.cache_server.run(cache, self.stop_event)
                tasks.append(asyncio.create_task(serving, name="input cache"))
            if keeper is not None:
                if keeper.done():
                    keeper.result()  # lost the Lease while starting: LeadershipLost
                tasks.append(keeper)
            stopper = asyncio.create_task(self.stop_event.wait())
            done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            for task in [*tasks, stopper]:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Stopped):
                    await task
            for task in done:
                if task is not stopper and not task.cancelled() and task.exception() is not None:
                    error = task.exception()
                    if not isinstance(error, Stopped):
                        raise error  # type: ignore[misc]
            log.info("stopping")
        except Stopped:
            log.info("stopping")
        finally:
            if keeper is not None and not keeper.done():
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper
            if self.leader is not None:
                await self.leader.release()
            await self.client.close()
            self.inventory.close()
