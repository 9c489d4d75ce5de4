"""The cloud's FastAPI application factory."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

import sxwl
from sxwl.cloud import errors, web
from sxwl.cloud.api import (
    admin,
    auth,
    billing,
    cpods,
    dev_env_ssh,
    dev_envs,
    endpoints,
    jobs,
    keys,
    me,
    metrics_route,
    ssh_keys,
)
from sxwl.cloud.api.agent import artifact_uploads, tunnel
from sxwl.cloud.api.agent import inputs as agent_inputs
from sxwl.cloud.api.agent import routes as agent
from sxwl.cloud.api.deps import plain_parameters
from sxwl.cloud.api.openai import files, fine_tuning, inference, models
from sxwl.cloud.background import (
    dev_env_cleanup,
    dev_env_idle,
    listener,
    liveness,
    metering,
    rate_events,
    scheduling,
    sqlite_watch,
)
from sxwl.cloud.config import Settings
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db import migrate, readiness
from sxwl.cloud.edge import error_handlers
from sxwl.cloud.edge.body_rules import BodyRules
from sxwl.cloud.edge.middleware import BodyLimit, HttpMetrics, RequestContext
from sxwl.cloud.edge.prefixed import PrefixedRouter
from sxwl.cloud.kit import logs
from sxwl.cloud.services.accounts import key_check
from sxwl.cloud.services.fleet import heartbeats
from sxwl.protocol import paths

log = logging.getLogger("sxwl.cloud")

API_PREFIX = paths.API
# The agent's routes first: they take most of the requests, and routes are matched in order.
API_ROUTERS = (
    agent.router,
    artifact_uploads.router,
    agent_inputs.router,
    auth.router,
    me.router,
    admin.router,
    cpods.router,
    jobs.router,
    dev_envs.router,
    ssh_keys.router,
    billing.router,
    models.api_router,
    endpoints.router,
    keys.router,
)
# The OpenAI-compatible API (the `openai` client with base_url=<cloud>/v1): docs/finetune.md.
OPENAI_PREFIX = errors.OPENAI_PREFIX
OPENAI_ROUTERS = (files.router, models.router, fine_tuning.router, inference.router)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    logs.stamp_request_ids()
    ctx = CloudContext.from_settings(settings)
    ctx.heartbeats = heartbeats.writer(ctx)
    migrate.upgrade(ctx.db.engine)
    key_check.verify(ctx.db, ctx.box)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        log.info("cloud started", extra={"event": "start"})
        ctx.notifier.bind(asyncio.get_running_loop())
        loops = [
            asyncio.create_task(liveness.run(ctx), name="liveness"),
            asyncio.create_task(scheduling.run(ctx), name="scheduling"),
            asyncio.create_task(metering.run(ctx), name="metering"),
            asyncio.create_task(dev_env_idle.run(ctx), name="dev-env-idle"),
            asyncio.create_task(dev_env_cleanup.run(ctx), name="dev-env-cleanup"),
            asyncio.create_task(notifier_counts.run(), name="notifier-metrics"),
            asyncio.create_task(rate_events.run(ctx), name="rate-events"),
            asyncio.create_task(listener.run(ctx), name="listener"),
            asyncio.create_task(sqlite_watch.run(ctx), name="sqlite-watch"),
            asyncio.create_task(ctx.tunnels.renew(), name="tunnel-holders"),
        ]
        ctx.tunnels.loop = asyncio.get_running_loop()
        yield
        await ctx.tunnels.close()  # agents re-dial another replica
        # Long-polls answer at once and the loops stop judging CPods, under any ASGI server (`sxwl
        # serve` says so earlier still, when the signal arrives: cli/server.py).
        ctx.notifier.shutdown()
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await ctx.keepalives.stop()
        ctx.db.dispose()

    app = FastAPI(
        title="算想云 sxwl",
        version=sxwl.__version__,
        openapi_url="/api/v1/openapi.json",
        # The bundled Swagger/ReDoc pages load from a CDN; the console must work offline.
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.ctx = ctx
    error_handlers.install(app)

    api = PrefixedRouter(prefix=API_PREFIX, dependencies=[Depends(plain_parameters)])
    for router in API_ROUTERS:
        api.include_router(router)
    app.include_router(api)
    openai_api = PrefixedRouter(prefix=OPENAI_PREFIX, dependencies=[Depends(plain_parameters)])
    for router in OPENAI_ROUTERS:
        openai_api.include_router(router)
    app.include_router(openai_api)
    app.include_router(tunnel.router)  # WebSockets: no HTTP dependencies, nothing in the OpenAPI document
    app.include_router(dev_env_ssh.router)

    registry = CollectorRegistry()
    metrics = HttpMetrics(registry)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    ready = readiness.Readiness(ctx.db.engine)

    @app.get("/readyz", include_in_schema=False)
    def readyz() -> JSONResponse:
        verdict = ready.check()
        details = {"database": verdict.database, "schema": verdict.schema}
        if verdict.ready:
            return JSONResponse({"status": "ready", **details})
        body = errors.error_body(503, "this replica is not ready", "not_ready", details)
        return JSONResponse(body, status_code=503)

    notifier_counts = metrics_route.install(app, ctx, registry)

    web.install(app)
    mounted = [(API_PREFIX, router) for router in API_ROUTERS] + [(OPENAI_PREFIX, r) for r in OPENAI_ROUTERS]
    rules = BodyRules(mounted + list(web.BODY_RULED), settings)  # the console's dataset upload
    app.add_middleware(BodyLimit, rule_for=rules.rule_for)
    app.add_middleware(RequestContext, metrics=metrics)
    document_bodies(app, agent.DOCUMENTED_BODIES)
    return app


def document_bodies(app: FastAPI, models: tuple[type[BaseModel], ...]) -> None:
    """Adds the schemas of bodies that endpoints parse themselves to the OpenAPI components."""
    plain = app.openapi

    def openapi() -> dict[str, Any]:
        spec = app.openapi_schema
        if spec is None:
            spec = plain()  # which also keeps it in app.openapi_schema
            _, defs = models_json_schema(
                [(m, "validation") for m in models], ref_template="#/components/schemas/{model}"
            )
            spec.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
        return spec

    app.openapi = openapi  # type: ignore[method-assign]
