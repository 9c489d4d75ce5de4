"""How large a request body may be and how long it may take to arrive, declared by each route that
needs more than the default (``@body_rule``) and looked up by the ``BodyLimit`` middleware, which
runs before routing, by the declared route's path.

A route with such a body reads it itself, after its dependencies have checked the caller: FastAPI
reads a body it declares (``File``, ``Form``, a model) before any dependency runs, so an anonymous
upload would be spooled whole before its 401 (api/uploads.py). ``BodyRules`` refuses to start an
app with a ruled route that declares one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import TypeVar

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.routing import compile_path

from sxwl.cloud.config import Settings

# (most bytes, seconds to receive them from the request's start), from the settings.
BodyRule = Callable[[Settings], tuple[int, float]]
Endpoint = TypeVar("Endpoint", bound=Callable[..., object])

_DECLARED: dict[Callable[..., object], BodyRule] = {}


def body_rule(rule: BodyRule) -> Callable[[Endpoint], Endpoint]:
    """Declares the body rule of the endpoint it decorates (put it below the route decorator)."""

    def declare(endpoint: Endpoint) -> Endpoint:
        _DECLARED[endpoint] = rule
        return endpoint

    return declare


def default_rule(settings: Settings) -> tuple[int, float]:
    return settings.max_body_bytes, settings.request_body_timeout_s


class BodyRules:
    """The rule for a request's method and path: that of the declared route whose path matches it,
    else the default. ``routers`` are the routers the app includes, each with its prefix."""

    def __init__(self, routers: Sequence[tuple[str, APIRouter]], settings: Settings) -> None:
        self.settings = settings
        for prefix, router in routers:
            for route in router.routes:
                if isinstance(route, APIRoute) and route.endpoint in _DECLARED and route.body_field:
                    raise RuntimeError(
                        f"{prefix}{route.path} has a body rule and a body FastAPI reads before it checks "
                        "the caller: read it in the endpoint (api/uploads.py)"
                    )
        self.declared = [
            (frozenset(route.methods or ()), compile_path(prefix + route.path)[0], _DECLARED[route.endpoint])
            for prefix, router in routers
            for route in router.routes
            if isinstance(route, APIRoute) and route.endpoint in _DECLARED
        ]
        # Paths repeat (every CPod's heartbeat has the same one): judge each at most once.
        self.rule_for = lru_cache(maxsize=4096)(self._find)

    def _find(self, method: str, path: str) -> tuple[int, float]:
        for methods, pattern, rule in self.declared:
            if method in methods and pattern.match(path):
                return rule(self.settings)
        return default_rule(self.settings)
