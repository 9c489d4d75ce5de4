"""What a process remembers of a /v1 call for a moment (services/endpoints/call_cache.py): entries
age out, a user's committed change drops that user's entries and only theirs, and a lookup that read
the database before such a change is not remembered after it."""

from __future__ import annotations

from sxwl.cloud.db.models import Role, User
from sxwl.cloud.kit.fresh import Fresh
from sxwl.cloud.services.endpoints.call_cache import CallCache, KnownCaller
from sxwl.cloud.services.endpoints.routes import Replica, Serving


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_entries_age_out_and_the_oldest_go_first_when_full() -> None:
    clock = Clock()
    fresh: Fresh[str, int] = Fresh(1.0, 2, clock)
    fresh.put("a", "u1", 1)
    clock.now += 0.5
    fresh.put("b", "u1", 2)
    assert (fresh.get("a"), fresh.get("b")) == (1, 2)
    clock.now += 0.5  # a is a second old, b half a second
    assert (fresh.get("a"), fresh.get("b")) == (None, 2)
    fresh.put("c", "u2", 3)
    fresh.put("d", "u2", 4)  # full: b, the oldest, goes
    assert (fresh.get("b"), fresh.get("c"), fresh.get("d")) == (None, 3, 4)
    assert len(fresh) == 2


def test_nothing_is_kept_when_the_moment_is_zero() -> None:
    fresh: Fresh[str, int] = Fresh(0, 10)
    fresh.put("a", "u1", 1)
    assert fresh.get("a") is None and len(fresh) == 0


def _caller(user_id: str) -> KnownCaller:
    return KnownCaller(User(id=user_id, email=f"{user_id}@example.com", password_hash="x", role=Role.USER))


def _serving(endpoint_id: str) -> Serving:
    return Serving(endpoint_id, "chat", (Replica("cpod-1", "engine-job-1", "job-1#1"),))


def test_a_users_change_drops_what_is_remembered_of_that_user_only() -> None:
    calls = CallCache(60)
    calls.remember_caller("sk-mine", _caller("u1"), calls.changes)
    calls.remember_caller("sk-theirs", _caller("u2"), calls.changes)
    calls.remember_serving("u1", "chat", _serving("e1"), calls.changes)
    calls.remember_serving("u2", "chat", _serving("e2"), calls.changes)
    mine = calls.caller("sk-mine")
    assert mine is not None and mine.user.id == "u1"
    assert calls.caller("sk-unknown") is None
    calls.user_changed("u1")
    assert calls.caller("sk-mine") is None and calls.serving("u1", "chat") is None
    theirs = calls.serving("u2", "chat")
    assert calls.caller("sk-theirs") is not None and theirs is not None and theirs.endpoint_id == "e2"


def test_a_lookup_that_read_before_a_change_is_not_remembered() -> None:
    calls = CallCache(60)
    seen = calls.changes  # a lookup starts reading the database
    calls.user_changed("u1")  # a revocation commits meanwhile
    calls.remember_caller("sk-mine", _caller("u1"), seen)
    calls.remember_serving("u1", "chat", _serving("e1"), seen)
    assert calls.caller("sk-mine") is None and calls.serving("u1", "chat") is None
    calls.remember_caller("sk-mine", _caller("u1"), calls.changes)  # the next lookup's is
    assert calls.caller("sk-mine") is not None
