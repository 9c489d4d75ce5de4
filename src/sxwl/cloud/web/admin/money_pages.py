"""An admin's money pages: 定价 (set or remove the price of a GPU product or of CPU cores) and 充值与
结算 (the platform's revenue, top-ups, payouts, what providers are owed). Every form is validated by
the API's own models (api/money_schemas.py) and goes through the same services; an error is shown
in place on its field and changes nothing."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.api.deps import Principal, csrf_ok
from sxwl.cloud.api.money_schemas import PayoutIn, PriceIn, TopUpIn
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import Role, User
from sxwl.cloud.db.money_models import LedgerAccount, LedgerTransaction, PriceResource
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.fleet import cpods
from sxwl.cloud.services.money import billing, earnings, ledger, prices
from sxwl.cloud.web.i18n import translate
from sxwl.cloud.web.kit import Admin, FormErrors, ctx_of, language, read_form, redirect, render
from sxwl.cloud.web.money import view as money_view
from sxwl.protocol.money import money_text

router = APIRouter(include_in_schema=False)
RECENT = 20


def _refused_csrf(request: Request) -> FormErrors:
    return {"form": translate(language(request), "error.csrf")}


# ---- prices -------------------------------------------------------------------------------------


def _prices(
    request: Request,
    principal: Principal,
    form: dict[str, str] | None = None,
    errors: FormErrors | None = None,
) -> Response:
    with ctx_of(request).db.session() as session:
        rows = prices.listing(session)
        emails = _emails(session, {r.updated_by_id for r in rows if r.updated_by_id})
        priced = {r.product for r in rows if r.resource == PriceResource.GPU}
        online = sorted({g.product for g in cpods.gpu_types(session)})
    return render(
        request,
        "admin_prices.html",
        principal,
        status=(403 if "form" in (errors or {}) else 422) if errors else 200,
        path="/admin/prices",
        rows=rows,
        emails=emails,
        unpriced=[p for p in online if p not in priced],
        online=online,
        form=form or {"resource": "gpu"},
        errors=errors or {},
    )


@router.get("/admin/prices")
def prices_page(request: Request, principal: Admin) -> Response:
    return _prices(request, principal)


@router.post("/admin/prices")
async def set_price(request: Request, principal: Admin) -> Response:
    lang = language(request)
    form = await read_form(request)
    if not csrf_ok(request, form.get("csrf_token")):
        return _prices(request, principal, form, _refused_csrf(request))
    resource = form.get("resource", "gpu")
    fields = {
        "price_per_hour_yuan": "price",
        "fee_percent": "fee",
        "product": "product",
        "resource": "resource",
    }
    try:
        body = PriceIn.model_validate(
            {
                "resource": resource,
                "product": form.get("product", "").strip() if resource == "gpu" else "",
                "price_per_hour_yuan": form.get("price", ""),
                "fee_percent": form.get("fee", ""),
            }
        )
    except ValidationError as exc:
        return _prices(request, principal, form, money_view.form_errors(lang, exc, fields))
    if body.resource == "gpu" and not body.product:
        return _prices(request, principal, form, {"product": translate(lang, "money.error.product")})
    with ctx_of(request).db.session() as session:
        prices.set_price(
            session,
            session.merge(principal.user),
            resource=PriceResource(body.resource),
            product=body.product,
            rate=prices.Rate(body.price_per_hour_yuan, body.fee_percent),
        )
    return redirect("/admin/prices?notice=price_set")


@router.post("/admin/prices/remove")
async def remove_price(request: Request, principal: Admin) -> Response:
    form = await read_form(request)
    if not csrf_ok(request, form.get("csrf_token")):
        return _prices(request, principal, None, _refused_csrf(request))
    chosen = form.get("resource")
    resource = PriceResource(chosen) if chosen in ("cpu", "storage") else PriceResource.GPU
    try:
        with ctx_of(request).db.session() as session:
            prices.set_price(
                session,
                session.merge(principal.user),
                resource=resource,
                product=form.get("product", ""),
                rate=None,
            )
    except AppError:
        return _prices(
            request, principal, None, {"remove": translate(language(request), "money.error.no_price")}
        )
    return redirect("/admin/prices?notice=price_removed")


# ---- top-ups and payouts ------------------------------------------------------------------------


def _emails(session: Session, ids: set[str]) -> dict[str, str]:
    return dict(session.execute(select(User.id, User.email).where(User.id.in_(ids))).all()) if ids else {}


def _money_values(session: Session) -> dict[str, Any]:
    owed = list(
        session.execute(
            select(LedgerAccount.owner_id, LedgerAccount.kind, LedgerAccount.balance).where(
                LedgerAccount.kind.in_((ledger.PROVIDER_PENDING, ledger.PROVIDER_AVAILABLE))
            )
        )
    )
    providers: dict[str, dict[str, int]] = {}
    for owner_id, kind, balance in owed:
        if owner_id:
            providers.setdefault(owner_id, {"pending": 0, "available": 0})[kind.removeprefix("provider_")] = (
                balance
            )
    recent = list(
        session.scalars(
            select(LedgerTransaction)
            .where(LedgerTransaction.kind.in_(("top_up", "payout")))
            .order_by(LedgerTransaction.created_at.desc())
            .limit(RECENT)
        )
    )
    ids = set(providers) | {i for tx in recent for i in (tx.actor_id, tx.payer_id, tx.provider_id) if i}
    return {
        "revenue": earnings.platform_revenue(session),
        "providers": sorted(providers.items(), key=lambda item: -item[1]["available"]),
        "recent": recent,
        "emails": _emails(session, ids),
    }


def _money(
    request: Request,
    principal: Principal,
    forms: dict[str, dict[str, str]] | None = None,
    errors: dict[str, FormErrors] | None = None,
) -> Response:
    with ctx_of(request).db.session() as session:
        values = _money_values(session)
    errors = errors or {}
    failed = next((e for e in errors.values() if e), None)
    return render(
        request,
        "admin_money.html",
        principal,
        status=(403 if "form" in failed else 422) if failed else 200,
        path="/admin/money",
        forms=forms or {},
        errors=errors,
        **values,
    )


@router.get("/admin/money")
def money_page(request: Request, principal: Admin) -> Response:
    return _money(request, principal)


def _validated(
    lang: str, model: type[TopUpIn] | type[PayoutIn], values: dict[str, str], fields: dict[str, str]
) -> tuple[TopUpIn | PayoutIn | None, FormErrors]:
    try:
        return model.model_validate(values), {}
    except ValidationError as exc:
        return None, money_view.form_errors(lang, exc, fields)


@router.post("/admin/money/top-up")
async def top_up(request: Request, principal: Admin) -> Response:
    lang = language(request)
    form = await read_form(request)
    forms = {"top_up": form}
    if not csrf_ok(request, form.get("csrf_token")):
        return _money(request, principal, forms, {"top_up": _refused_csrf(request)})
    with ctx_of(request).db.session() as session:
        user = money_view.find_user(session, form.get("user", ""))
        values = {
            "user_id": user.id if user else "-",
            "amount_yuan": form.get("amount", ""),
            "note": form.get("note", ""),
        }
        body, problems = _validated(lang, TopUpIn, values, {"amount_yuan": "amount", "note": "note"})
        if user is None or user.role == Role.PROVIDER:
            problems = {
                "user": translate(lang, "money.error.provider_user" if user else "money.error.no_user")
            } | problems
        if isinstance(body, TopUpIn) and not problems:
            billing.top_up(
                session,
                session.merge(principal.user),
                user_id=body.user_id,
                amount=body.amount_yuan,
                note=body.note,
                idempotency_key=None,
            )
    if problems:
        return _money(request, principal, forms, {"top_up": problems})
    return redirect("/admin/money?notice=topped_up")


@router.post("/admin/money/payout")
async def payout(request: Request, principal: Admin) -> Response:
    lang = language(request)
    form = await read_form(request)
    forms = {"payout": form}
    if not csrf_ok(request, form.get("csrf_token")):
        return _money(request, principal, forms, {"payout": _refused_csrf(request)})
    ctx = ctx_of(request)
    with ctx.db.session() as session:
        provider = money_view.find_user(session, form.get("provider", ""))
        provider_id = provider.id if provider and provider.role == Role.PROVIDER else None
    values = {
        "provider_id": provider_id or "-",
        "amount_yuan": form.get("amount", ""),
        "reference": form.get("reference", ""),
    }
    body, problems = _validated(lang, PayoutIn, values, {"amount_yuan": "amount", "reference": "reference"})
    if provider_id is None:
        problems = {"provider": translate(lang, "money.error.no_provider")} | problems
    if isinstance(body, PayoutIn) and not problems:
        try:
            with ctx.db.session(immediate=True) as session:
                earnings.payout(
                    session,
                    session.merge(principal.user),
                    provider_id=body.provider_id,
                    amount=body.amount_yuan,
                    reference=body.reference,
                    idempotency_key=None,
                )
        except AppError as exc:  # more than is available (the service checks it under a lock)
            problems = {
                "amount": _over_available(ctx, lang, body.provider_id) if exc.status == 422 else exc.message
            }
    if problems:
        return _money(request, principal, forms, {"payout": problems})
    return redirect("/admin/money?notice=paid_out")


def _over_available(ctx: CloudContext, lang: str, provider_id: str) -> str:
    with ctx.db.session() as session:
        available = ledger.balance(session, ledger.account_key(ledger.PROVIDER_AVAILABLE, provider_id))
    return translate(lang, "money.error.over_available", available=money_text(available))
