"""``/metrics``: what this process measured, plus the fleet's gauges from the database, for a
scraper that sends the metrics token (``SXWL_METRICS_TOKEN`` as ``Authorization: Bearer``): the
fleet's size, its GPUs and its queue are not everyone's to read.

One process: its own registry. Several workers (PROMETHEUS_MULTIPROC_DIR set by the supervisor,
cli/supervisor.py): the answering worker adds up every worker's counters and histograms from the
shared files, and reads the fleet's gauges once (docs/operations.md)."""

from __future__ import annotations

import hashlib
import hmac
import os

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess

from sxwl.cloud.api.deps import bearer_token
from sxwl.cloud.context import CloudContext
from sxwl.cloud.errors import AppError
from sxwl.cloud.kit import metrics
from sxwl.cloud.services.fleet.fleet_metrics import FleetCollector

_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def install(app: FastAPI, ctx: CloudContext, http_registry: CollectorRegistry) -> metrics.NotifierCounts:
    """Adds the route; returns the notifier's publisher for the app's lifespan to run."""
    metrics.count_queries(ctx.db.engine)
    counts = metrics.NotifierCounts(ctx.notifier)
    if os.environ.get(_MULTIPROC_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # untyped upstream
    else:
        registry = http_registry
        for instrument in metrics.INSTRUMENTS:
            registry.register(instrument)
    registry.register(FleetCollector(ctx))

    @app.get("/metrics", include_in_schema=False)
    def prometheus(request: Request) -> Response:
        if not scraper(ctx.settings.metrics_token, bearer_token(request)):
            raise AppError(
                401,
                "/metrics needs the metrics token: Authorization: Bearer <SXWL_METRICS_TOKEN>",
                headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
            )
        counts.publish()
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return counts


def scraper(expected: str, sent: str | None) -> bool:
    """Whether ``sent`` is the metrics token, compared in constant time (as digests, so not even
    its length shows); no token set lets no one in."""
    if not expected or sent is None:
        return False
    digest = hashlib.sha256
    return hmac.compare_digest(digest(sent.encode()).digest(), digest(expected.encode()).digest())
