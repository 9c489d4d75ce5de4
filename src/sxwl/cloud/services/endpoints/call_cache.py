"""What a call to an endpoint resolves before it travels (docs/endpoints.md, "Calling an endpoint"):
who calls (an inference key and its owner, or a user's API token) and which replicas serve the model
it names. Each cloud process remembers both for a moment (``call_cache_s``, a second by default);
/v1's routes look here first.

Resolving them took two database round trips on every call, about 3 ms of the 14–16 ms the path
added to a streamed answer's time to first token (bench/serving.py, docs/endpoints.md). A change to
a user's keys, tokens or endpoints drops what every process remembers of that user once it commits
(``user_changed`` on the notifier: at once here, through NOTIFY on the other replicas), so a revoked
key is refused by its next call. What no user's action changes, a replica lost or become ready, is
seen within that moment; a call sent meanwhile to a replica that is gone gets the 503 with
Retry-After of an unreachable one. A key's limits are still counted in the database on every call
(key_limits.py), and neither a credential that is not found nor an endpoint that does not serve is
remembered."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime

from sxwl.cloud.db.endpoint_models import InferenceKey
from sxwl.cloud.db.models import User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.kit.fresh import Fresh
from sxwl.cloud.kit.security import token_hash
from sxwl.cloud.services.endpoints.routes import Serving

SIZE = 10_000  # entries of each kind; the oldest go first


@dataclass(frozen=True)
class KnownCaller:
    """A credential's owner, detached from any session: ``key`` for an inference key, else the API
    token's ``expires_at`` (checked on every use)."""

    user: User
    key: InferenceKey | None = None
    expires_at: datetime | None = None


class CallCache:
    """``changes``: read before a lookup in the database and handed to ``remember_*``, so that what a
    lookup read just before a user's change committed is not remembered after it."""

    def __init__(self, fresh_s: float) -> None:
        self._callers: Fresh[str, KnownCaller] = Fresh(fresh_s, SIZE)
        self._serving: Fresh[tuple[str, str], Serving] = Fresh(fresh_s, SIZE)
        self._lock = threading.Lock()
        self.changes = 0

    def caller(self, secret: str) -> KnownCaller | None:
        """The live credential ``secret`` names, if it is remembered."""
        known = self._callers.get(token_hash(secret))
        if known is None or (known.expires_at is not None and known.expires_at <= utcnow()):
            return None
        return known

    def remember_caller(self, secret: str, known: KnownCaller, changes: int) -> None:
        with self._lock:
            if changes == self.changes:
                self._callers.put(token_hash(secret), known.user.id, known)

    def serving(self, owner_id: str, model: str) -> Serving | None:
        return self._serving.get((owner_id, model))

    def remember_serving(self, owner_id: str, model: str, serving: Serving, changes: int) -> None:
        with self._lock:
            if changes == self.changes:
                self._serving.put((owner_id, model), owner_id, serving)

    def user_changed(self, user_id: str) -> None:
        with self._lock:
            self.changes += 1
            self._callers.forget_owner(user_id)
            self._serving.forget_owner(user_id)
