"""On SQLite, how the one server process hears what other processes write to its file.

One server owns a SQLite file (cli/single_server.py), and its own writes wake its waiters directly
(notify.py). Another process can still commit to the file: ``sxwl admin`` (a top-up, a GPU limit, a
price), or any tool that opens it. Instead of every held long-poll re-reading each second for
that, this task asks SQLite once a second, on a connection of its own, whether any other
connection has committed since (``PRAGMA data_version``: it changes only then, and costs no read of
the database). When it has, one read finds what such a write can have given the held long-polls
(services/scheduling/dispatch.py, ``news``) and wakes only those, with the scheduler and the job followers.
While the watch runs, waiters rest until woken or the backstop (docs/replicas.md, "SQLite"); when
it fails, they go back to re-reading every second until it runs again."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import PoolProxiedConnection

from sxwl.cloud.context import CloudContext
from sxwl.cloud.services.scheduling import dispatch

log = logging.getLogger("sxwl.sqlite_watch")

# As often as an unhearing waiter re-reads: a write by another process is seen no later than before.
WATCH_S = 1.0
FIRST_RETRY_S = 0.1
MAX_RETRY_S = 5.0


async def run(ctx: CloudContext) -> None:
    if ctx.db.engine.url.get_backend_name() != "sqlite":
        return  # PostgreSQL: the listener hears other replicas (background/listener.py)
    retry = FIRST_RETRY_S
    while not ctx.notifier.stopping:
        try:
            await _watch(ctx)
        except (sqlite3.Error, SQLAlchemyError, OSError) as exc:
            log.warning("watching the database file failed: %s", exc, extra={"event": "sqlite_watch_lost"})
        finally:
            if ctx.notifier.hearing:
                retry = FIRST_RETRY_S
                ctx.notifier.hearing = False
                ctx.notifier.rouse()  # waiters go back to re-reading every second until it runs again
        await asyncio.sleep(retry)
        retry = min(retry * 2, MAX_RETRY_S)


async def _watch(ctx: CloudContext) -> None:
    # One thread owns the connection: closing it from another while a PRAGMA runs (the task
    # cancelled at shutdown) crashed the process in SQLite. Its close queues behind the PRAGMA.
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-watch")
    loop = asyncio.get_running_loop()
    connection = await loop.run_in_executor(thread, ctx.db.engine.raw_connection)
    try:
        # The commands' mark first: a command added between it and the version below committed
        # before this process hears, and is found by the re-read that hearing starts with.
        seen = await asyncio.to_thread(dispatch.last_command, ctx)
        version = await loop.run_in_executor(thread, _data_version, connection)
        ctx.notifier.hearing = True
        ctx.notifier.rouse()
        log.info("watching the database file for other processes' writes", extra={"event": "sqlite_watch_up"})
        while True:
            await asyncio.sleep(WATCH_S)
            now = await loop.run_in_executor(thread, _data_version, connection)
            if now == version:
                continue
            # Read after the version: whatever committed before it is in this read, and whatever
            # commits after it changes the version again.
            version = now
            news = await asyncio.to_thread(dispatch.news, ctx, seen)
            seen = news.commands_seen
            ctx.notifier.file_changed(news.cpods)
    finally:
        thread.submit(connection.close)  # back to the pool, after any PRAGMA still running
        thread.shutdown(wait=False)


def _data_version(connection: PoolProxiedConnection) -> int:
    """Changes when, and only when, another connection (of any process) commits to the file."""
    cursor = connection.cursor()
    try:
        cursor.execute("PRAGMA data_version")
        row = cursor.fetchone()
    finally:
        cursor.close()
    if row is None:
        raise sqlite3.OperationalError("PRAGMA data_version returned nothing")
    return int(row[0])
