"""费用 (a compute user's balance, burn rate and monthly statement) and 收益 (a provider's earnings:
today, this month, pending, available, paid out, per CPod and GPU product). The numbers come from
the same services as the REST API (services/money/billing.py, earnings.py); the CSV links are its
endpoints, which take the console's cookie."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy import select

from sxwl.cloud.db.models import CPod, Role
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.money import billing, earnings
from sxwl.cloud.web.kit import ComputeViewer, JobsViewer, ctx_of, error_page, language, render
from sxwl.cloud.web.money import view as money_view

router = APIRouter(include_in_schema=False)


@router.get("/billing")
def billing_page(request: Request, principal: JobsViewer, month: str | None = None) -> Response:
    ctx, lang = ctx_of(request), language(request)
    if not ctx.settings.billing_enabled:
        return error_page(request, 404, principal)
    chosen = money_view.month_of(lang, month, utcnow())
    with ctx.db.session() as session:
        balance = billing.balance_of(session, principal.user.id)
        rows = billing.usage_rows(session, chosen.start, chosen.end, payer_id=principal.user.id)
        top_ups = billing.top_ups(session, principal.user.id, chosen.start, chosen.end)
        used = {r.cpod_id for r in rows if r.cpod_id is not None}
        names = dict(session.execute(select(CPod.id, CPod.name).where(CPod.id.in_(used))).all())
    return render(
        request,
        "billing.html",
        principal,
        status=422 if chosen.error else 200,
        balance=balance,
        hours_left=money_view.hours_left(lang, balance),
        month=chosen,
        rows=rows,
        names=names,
        total=sum(r.gross for r in rows),
        top_ups=top_ups,
        csv_url=f"/api/v1/billing/statement?month={chosen.name}&format=csv",
    )


@router.get("/earnings")
def earnings_page(request: Request, principal: ComputeViewer, month: str | None = None) -> Response:
    ctx, lang = ctx_of(request), language(request)
    if not ctx.settings.billing_enabled or principal.user.role != Role.PROVIDER:
        # An admin sees every provider's earnings on the top-ups and payouts page instead.
        return error_page(request, 404 if not ctx.settings.billing_enabled else 403, principal)
    now = utcnow()
    chosen = money_view.month_of(lang, month, now)
    with ctx.db.session() as session:
        mine = earnings.earnings_of(session, principal.user.id, chosen.start, chosen.end, now)
        mine_cpods = select(CPod.id, CPod.name).where(CPod.owner_id == principal.user.id)
        names = dict(session.execute(mine_cpods).all())
    return render(
        request,
        "earnings.html",
        principal,
        status=422 if chosen.error else 200,
        e=mine,
        month=chosen,
        names=names,
        hold_days=money_view.hold_days(ctx.settings.earnings_hold_s),
        csv_url=f"/api/v1/earnings?month={chosen.name}&format=csv",
    )
