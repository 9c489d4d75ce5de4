"""What every request and background loop of one cloud process shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from sxwl.cloud.config import Settings
from sxwl.cloud.db.engine import Database
from sxwl.cloud.edge.keepalives import Keepalives
from sxwl.cloud.kit.groupcommit import GroupCommit
from sxwl.cloud.kit.notify import Notifier
from sxwl.cloud.kit.ratelimit import RateLimiter
from sxwl.cloud.kit.security import Passwords, SecretBox
from sxwl.cloud.services.endpoints.call_cache import CallCache
from sxwl.cloud.services.fleet.beat import Beat
from sxwl.cloud.services.fleet.engine_loads import EngineLoads
from sxwl.cloud.services.scheduling.capacity import CapacityCache
from sxwl.cloud.storage import ArtifactStore
from sxwl.cloud.storage.select import artifact_store
from sxwl.cloud.tunnel.hub import Tunnels
from sxwl.protocol import HeartbeatReply


@dataclass
class Limiters:
    login_ip: RateLimiter
    login_account: RateLimiter
    register_ip: RateLimiter
    register_account: RateLimiter


@dataclass
class CloudContext:
    settings: Settings
    db: Database
    passwords: Passwords
    box: SecretBox
    limiters: Limiters = field(init=False)
    notifier: Notifier = field(default_factory=Notifier)
    keepalives: Keepalives = field(init=False)  # of the streamed long-polls (cloud/edge/keepalives.py)
    artifacts: ArtifactStore = field(init=False)
    # Free GPUs kept between scheduling passes (services/scheduling/capacity.py): only facts that never change
    # under their key, checked against the database every pass.
    capacity: CapacityCache = field(default_factory=CapacityCache)
    # Heartbeats that arrive together share a transaction; set by ``create_app``, because the
    # writer's logic (services/fleet/heartbeats.py) itself needs this context.
    heartbeats: GroupCommit[Beat, HeartbeatReply] = field(init=False)
    # The endpoint replicas' engine loads the heartbeats to this process brought (per process:
    # a snapshot the next heartbeat replaces; docs/replica-state.md).
    engine_loads: EngineLoads = field(default_factory=EngineLoads)
    # The agents' tunnels this process holds, and relays to those other replicas hold (docs/tunnel.md).
    tunnels: Tunnels = field(init=False)
    # The callers and routes of /v1 calls to endpoints, remembered for a moment
    # (services/endpoints/call_cache.py).
    calls: CallCache = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.artifacts = artifact_store(s)
        self.keepalives = Keepalives(s.longpoll_keepalive_s)
        self.tunnels = Tunnels(self.db, self.box, s.replica_url, s.tunnel_ping_s)
        self.calls = CallCache(s.call_cache_s)
        postgres = self.db.engine.dialect.name == "postgresql"
        self.notifier.watch(self.db.sessions, self.db.immediate_sessions, broadcast=postgres)
        self.notifier.user_listeners.append(self.calls.user_changed)
        self.limiters = Limiters(
            login_ip=self._limiter("login_ip", s.rate_login_ip, "login attempts from this address"),
            login_account=self._limiter(
                "login_account", s.rate_login_account, "login attempts for this account"
            ),
            register_ip=self._limiter("register_ip", s.rate_register_ip, "registrations from this address"),
            register_account=self._limiter(
                "register_account", s.rate_register_account, "registration attempts for this email"
            ),
        )

    def _limiter(self, name: str, rate: str, what: str) -> RateLimiter:
        return RateLimiter(name, rate, what, self.db, self.box)

    @classmethod
    def from_settings(cls, settings: Settings) -> CloudContext:
        return cls(
            settings=settings,
            db=Database(settings.resolved_database_url()),
            passwords=Passwords(
                settings.argon2_time_cost, settings.argon2_memory_kib, settings.argon2_parallelism
            ),
            box=SecretBox(settings.resolved_secret_key()),
        )
