"""How large a request body may be and how long it may take to arrive, declared by each route that
needs more than the default (``@body_rule``) and looked up by the ``BodyLimit`` middleware, which
runs before routing, through the route that will serve the request."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import TypeVar

from starlette.routing import BaseRoute, Match

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
    """The rule for a request's method and path, by the first route that fully matches it."""

    def __init__(self, routes: list[BaseRoute], settings: Settings) -> None:
        self.routes = routes
        self.settings = settings
        # Paths repeat (every CPod's heartbeat has the same one): match each at most once.
        self.rule_for = lru_cache(maxsize=4096)(self._find)

    def _find(self, method: str, path: str) -> tuple[int, float]:
        scope = {"type": "http", "method": method, "path": path, "root_path": ""}
        for route in self.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                endpoint = getattr(route, "endpoint", None)
                rule = _DECLARED.get(endpoint, default_rule) if callable(endpoint) else default_rule
                return rule(self.settings)
        return default_rule(self.settings)
