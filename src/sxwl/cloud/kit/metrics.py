"""What each cloud process measures as it works: scheduling passes, dispatch latency, database
queries and wake-up notifications. The fleet's state is read from the database at scrape time
instead (metrics_fleet.py); metrics_route.py serves both.

Under ``sxwl serve --workers N`` every worker is spawned with PROMETHEUS_MULTIPROC_DIR set, so these
instruments write to shared files that the answering worker adds up (docs/operations.md, "Several
worker processes and metrics")."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from sqlalchemy import Engine, event

from sxwl.cloud.db.types import utcnow
from sxwl.cloud.kit.notify import Notifier

LONGPOLLS_HELD = Gauge(
    "sxwl_longpolls_held",
    "CPod long-polls this process holds open",
    multiprocess_mode="livesum",
    registry=None,
)

# Registered in each app's registry by metrics_route.py, never in the global default registry: a
# process (a test) may run several apps.
SCHEDULING_PASS = Histogram(
    "sxwl_scheduling_pass_duration_seconds",
    "Time one scheduling pass took",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=None,
)
DISPATCH_LATENCY = Histogram(
    "sxwl_dispatch_latency_seconds",
    "From a job attempt's assignment to its agent's first report that it is starting or running",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
    registry=None,
)
DB_QUERIES = Counter("sxwl_db_queries", "SQL statements sent to the database", registry=None)
NOTIFICATIONS_SENT = Counter(
    "sxwl_notifications_sent", "Wake-up notifications this replica sent to others", registry=None
)
NOTIFICATIONS_RECEIVED = Counter(
    "sxwl_notifications_received", "Wake-up notifications this replica received from others", registry=None
)
# Endpoints (docs/endpoints.md), labelled by the endpoint's id: as many series as live endpoints.
ENDPOINT_REQUESTS = Counter(
    "sxwl_endpoint_requests",
    "Calls to an endpoint, by outcome (ok, error, cut)",
    ["endpoint", "outcome"],
    registry=None,
)
ENDPOINT_FIRST_TOKEN = Histogram(
    "sxwl_endpoint_time_to_first_token_seconds",
    "From a call's arrival to the engine's first bytes of answer (the first chunk of a stream)",
    ["endpoint"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
    registry=None,
)
ENDPOINT_TOKENS = Counter(
    "sxwl_endpoint_tokens",
    "Tokens the engines counted, by kind (prompt, completion)",
    ["endpoint", "kind"],
    registry=None,
)
ENDPOINT_STREAMS = Gauge(
    "sxwl_endpoint_open_streams",
    "Streams this process relays now",
    ["endpoint"],
    multiprocess_mode="livesum",
    registry=None,
)
INSTRUMENTS = (
    SCHEDULING_PASS,
    DISPATCH_LATENCY,
    DB_QUERIES,
    NOTIFICATIONS_SENT,
    NOTIFICATIONS_RECEIVED,
    LONGPOLLS_HELD,
    ENDPOINT_REQUESTS,
    ENDPOINT_FIRST_TOKEN,
    ENDPOINT_TOKENS,
    ENDPOINT_STREAMS,
)

# How often a worker copies its notifier's counts into the shared metric files, so that a scrape
# answered by another worker sees them.
PUBLISH_EVERY_S = 5.0


def observe_dispatch(assigned_at: datetime | None) -> None:
    """Called once per attempt, when its agent first acknowledges it."""
    if assigned_at is not None:
        DISPATCH_LATENCY.observe(max((utcnow() - assigned_at).total_seconds(), 0.0))


def count_queries(engine: Engine) -> None:
    def counted(*_args: Any) -> None:
        DB_QUERIES.inc()

    event.listen(engine, "before_cursor_execute", counted)


class NotifierCounts:
    """Copies a notifier's running totals into the counters, and its held long-polls into the
    gauge (the notifier counts in plain integers: it runs on the event loop, and a total read now
    and then is all the metric needs)."""

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier
        self.sent = 0
        self.received = 0

    def publish(self) -> None:
        sent, received = self.notifier.notifications_sent, self.notifier.notifications_received
        NOTIFICATIONS_SENT.inc(max(sent - self.sent, 0))
        NOTIFICATIONS_RECEIVED.inc(max(received - self.received, 0))
        self.sent, self.received = sent, received
        LONGPOLLS_HELD.set(self.notifier.held_polls())

    async def run(self) -> None:
        while not self.notifier.stopping:
            self.publish()
            await asyncio.sleep(PUBLISH_EVERY_S)
