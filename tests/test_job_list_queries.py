"""Job lists cost the same few SQL statements however many rows a page shows: queue positions and
owners' emails are read for the whole page at once, not once per row (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from fastapi.testclient import TestClient
from sqlalchemy import event

from sxwl.cloud.api import jobs as jobs_api
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import Role, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.jobs import jobs
from sxwl.cloud.web.jobs import view as jobs_view
from sxwl.protocol.jobs import JobIn
from tests.test_cpods_api import ctx_of


def statements(ctx: CloudContext, action: Callable[[], object]) -> int:
    """SQL statements ``action`` sends; only this thread's, as the cloud's own loops share the engine."""
    me, count = threading.get_ident(), 0

    def counted(*_: object) -> None:
        nonlocal count
        if threading.get_ident() == me:
            count += 1

    event.listen(ctx.db.engine, "before_cursor_execute", counted)
    try:
        action()
    finally:
        event.remove(ctx.db.engine, "before_cursor_execute", counted)
    return count


def add_queued_jobs(ctx: CloudContext, first: int, last: int) -> None:
    """One queued job for each of users ``first``..``last``, each its own owner."""
    with ctx.db.session() as session:
        for i in range(first, last + 1):
            owner = User(email=f"user{i}@example.com", password_hash="-", role=Role.USER)
            session.add(owner)
            session.flush()
            jobs.submit(ctx, session, owner, JobIn(name=f"job-{i}", command="true"))


def test_a_page_of_fifty_jobs_costs_what_a_page_of_two_does(client: TestClient) -> None:
    ctx = ctx_of(client)
    with ctx.db.session() as session:
        admin = User(email="root@example.com", password_hash="-", role=Role.ADMIN)
        session.add(admin)

    def api_page() -> None:
        jobs_api.list_jobs(user=admin, ctx=ctx, per_page=50, all=True)

    def console_page() -> None:
        with ctx.db.session() as session:
            jobs_view.job_list(session, admin, "en", utcnow(), "all", "", 1, everyone=True)

    add_queued_jobs(ctx, 1, 2)
    small = (statements(ctx, api_page), statements(ctx, console_page))
    add_queued_jobs(ctx, 3, 50)
    assert (statements(ctx, api_page), statements(ctx, console_page)) == small

    page = jobs_api.list_jobs(user=admin, ctx=ctx, per_page=50, all=True)
    # Newest first: the last one submitted is the last in the queue.
    assert [(j.owner_email, j.queue_position) for j in page.items] == [
        (f"user{i}@example.com", i) for i in range(50, 0, -1)
    ]
    with ctx.db.session() as session:
        listing = jobs_view.job_list(session, admin, "en", utcnow(), "all", "", 1, everyone=True)
    assert [(r.owner_email, r.queue_position) for r in listing.rows] == [
        (f"user{i}@example.com", i) for i in range(50, 30, -1)
    ]
