"""On PostgreSQL, one connection per replica LISTENs for the wake-ups other replicas commit
(notify.py) and hands them to this process's scheduler, long-polls and job followers.

A notification sent while this connection is down is lost, so every (re)connection, and every
drop, wakes everyone once to re-read; meanwhile waiters re-read every second (notify.py,
``reread_s``). A connection can also fail silently (a cut network, a server that stopped
delivering): after ``PROBE_S`` without a notification the listener sends one to itself on this
connection, and one that does not come back within ``PROBE_TIMEOUT_S`` counts as a drop. So a
deaf listener is found within about 40 s, and waiters can trust silence for much longer than
that (``SXWL_LONGPOLL_BACKSTOP_S``). How wake-ups travel: docs/replicas.md."""

from __future__ import annotations

import asyncio
import logging

import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy import URL

from sxwl.cloud.context import CloudContext
from sxwl.cloud.kit.notify import CHANNEL

log = logging.getLogger("sxwl.listener")

FIRST_RETRY_S = 0.1
MAX_RETRY_S = 5.0
# A connection whose peer vanished without a FIN (a failed-over database, a cut network) delivers
# nothing and reports nothing; TCP keepalives find it dead within about 25 s.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}
# A server that accepts the connection and then says nothing must not hold a reconnect forever.
CONNECT_TIMEOUT_S = 10
PROBE_S = 30.0
PROBE_TIMEOUT_S = 10.0


class ProbeLost(OSError):
    """The listening connection did not deliver this replica's own probe in time."""


def conninfo(url: URL) -> str:
    """The libpq connection string of the cloud's SQLAlchemy URL (its password included: never log it)."""
    return make_conninfo(
        url.set(drivername="postgresql").render_as_string(hide_password=False),
        connect_timeout=CONNECT_TIMEOUT_S,
        **KEEPALIVES,
    )


async def run(ctx: CloudContext) -> None:
    url = ctx.db.engine.url
    if url.get_backend_name() != "postgresql":
        return  # SQLite: one process, whose wake-ups never leave it
    target = conninfo(url)
    retry = FIRST_RETRY_S
    while not ctx.notifier.stopping:
        try:
            await _listen(ctx, target)
        except (psycopg.Error, OSError) as exc:
            # libpq's messages name the host, never the password.
            log.warning("listening connection failed: %s", exc, extra={"event": "listener_lost"})
        finally:
            if ctx.notifier.hearing:
                retry = FIRST_RETRY_S
                ctx.notifier.hearing = False
                ctx.notifier.rouse()  # waiters go back to re-reading every second until we are back
        await asyncio.sleep(retry)
        retry = min(retry * 2, MAX_RETRY_S)


async def _listen(ctx: CloudContext, target: str) -> None:
    async with await psycopg.AsyncConnection.connect(target, autocommit=True) as conn:
        await conn.execute(f"LISTEN {CHANNEL}")
        ctx.notifier.hearing = True
        # What other replicas committed while nobody listened is found by re-reading once.
        ctx.notifier.rouse()
        log.info("listening for other replicas' wake-ups", extra={"event": "listener_up"})
        probe = f"{ctx.notifier.origin} probe"
        while True:
            if await _hear(ctx, conn, within_s=PROBE_S, until=None):
                continue  # it delivered within the interval: alive
            try:
                async with asyncio.timeout(PROBE_TIMEOUT_S):
                    await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, probe))
                    await _hear(ctx, conn, within_s=None, until=probe)
            except TimeoutError:
                raise ProbeLost(f"its own probe did not come back within {PROBE_TIMEOUT_S:g} s") from None


async def _hear(
    ctx: CloudContext, conn: psycopg.AsyncConnection[object], *, within_s: float | None, until: str | None
) -> bool:
    """Hands notifications to the notifier until ``until`` arrives (True) or ``within_s`` pass;
    True as well when any arrived."""
    heard = False
    async for notification in conn.notifies(timeout=within_s):
        if notification.payload == until:
            return True
        ctx.notifier.heard(notification.payload)
        heard = True
    return heard
