"""What the money pages show, shaped for templates: the month a page is about, the low-balance
warning, the estimate on the submit form, and form errors about amounts in the console's language.
Amounts stay micro-yuan until a template writes them (the ``yuan`` filter: protocol/money.py's
``money_text``, the one rule for amounts people read)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from sxwl.cloud.db.models import Role, User
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.money import billing
from sxwl.cloud.services.money.billing import Balance
from sxwl.cloud.services.money.prices import PriceBook
from sxwl.cloud.web.i18n import translate
from sxwl.protocol.jobs import JobFields
from sxwl.protocol.money import MAX_AMOUNT_YUAN, MAX_PRICE_YUAN, cost, money_text


@dataclass(frozen=True)
class Month:
    name: str  # YYYY-MM
    start: datetime
    end: datetime
    error: str | None  # what was wrong with the month asked for (this month is shown instead)


def month_of(lang: str, asked: str | None, now: datetime) -> Month:
    """The month a statement page shows: the one asked for, else this one with an error in place."""
    current = now.strftime("%Y-%m")
    try:
        start, end = billing.month_bounds(asked or current)
        return Month(asked or current, start, end, None)
    except ValueError:
        start, end = billing.month_bounds(current)
        return Month(current, start, end, translate(lang, "money.error.month"))


def warning(lang: str, balance: Balance) -> str | None:
    """The banner a compute user sees: nothing left to run on, or less than an hour of the burn."""
    if balance.balance <= 0:
        return translate(lang, "billing.empty", balance=money_text(balance.balance))
    if balance.low:
        return translate(
            lang, "billing.low", balance=money_text(balance.balance), burn=money_text(balance.burn_per_hour)
        )
    return None


@dataclass(frozen=True)
class FundsLink:
    url: str
    label: str  # an i18n key


def short_of_funds(lang: str, exc: AppError, role: Role) -> tuple[str, FundsLink]:
    """A submission refused for its balance (402 of ``billing.require_funds``), for the form that
    was sent: how much is missing, who can top up, and the link to where that happens (an
    administrator tops up on 充值与结算; a compute user asks one, and sees the balance on 费用)."""
    details = exc.details if isinstance(exc.details, dict) else {}
    balance, required, missing = (int(details.get(k) or 0) for k in ("balance", "required", "missing"))
    admin = role == Role.ADMIN
    who = "" if admin else translate(lang, "funds.ask_admin")
    if required > 0:
        text = translate(
            lang,
            "funds.short",
            balance=money_text(balance),
            required=money_text(required),
            missing=money_text(missing),
        )
    else:  # no price yet: nothing is estimated, but an empty balance never submits
        text = translate(lang, "funds.empty", balance=money_text(balance))
    link = FundsLink("/admin/money", "funds.top_up") if admin else FundsLink("/billing", "billing.link")
    return f"{text}{who}", link


def hold_days(hold_s: float) -> str:
    """The earnings hold in days, as the pages say it ("7", "0.5")."""
    return f"{hold_s / 86400:g}"


def hours_left(lang: str, balance: Balance) -> str:
    left = balance.hours_left
    return translate(lang, "billing.hours", hours=f"{left:.1f}") if left is not None else "—"


def estimate_text(lang: str, session: Session, spec: JobFields | None) -> str:
    """The submit form's estimate for what it holds now (app.js recomputes it as the form changes)."""
    if spec is None:
        return ""
    units, rate = billing.rate_for(session, spec)
    if rate is None:
        return translate(lang, "job_new.estimate_none")
    per_hour = money_text(units * rate.price_per_hour)
    if spec.max_runtime_s is None:
        return translate(lang, "job_new.estimate_open", per_hour=per_hour)
    total = money_text(cost(units, rate.price_per_hour, spec.max_runtime_s * 1_000_000))
    return translate(
        lang, "job_new.estimate", total=total, per_hour=per_hour, minutes=spec.max_runtime_s // 60
    )


def form_spec(form: Mapping[str, str]) -> JobFields | None:
    """The resources the submit form asks for, for its estimate; None while they are not valid yet."""
    try:
        minutes = form.get("max_runtime_min", "").strip()
        return JobFields(
            command="estimate",
            gpu_product=form.get("gpu_product") or None,
            gpus_per_node=int(form.get("gpus_per_node") or 0),
            nodes=int(form.get("nodes") or 1),
            max_runtime_s=int(minutes) * 60 if minutes else None,
        )
    except (ValueError, ValidationError):  # ValidationError is a ValueError; named for the reader
        return None


def form_prices(book: PriceBook) -> dict[str, int]:
    """Micro-yuan per unit-hour for the submit form's script: per GPU product, "" for the cheapest
    (a job that names no product is placed at it) and "cpu"."""
    prices = {product: rate.price_per_hour for product, rate in book.gpu.items()}
    if (cheapest := book.cheapest_gpu()) is not None:
        prices[""] = cheapest.price_per_hour
    if book.cpu is not None:
        prices["cpu"] = book.cpu.price_per_hour
    return prices


def find_user(session: Session, who: str) -> User | None:
    """A user by email or id, as an admin types it into the top-up and payout forms."""
    who = who.strip()
    if not who:
        return None
    return session.scalar(select(User).where(or_(User.email == who.lower(), User.id == who)))


# ---- form errors --------------------------------------------------------------------------------

_REASONS = (  # the validators' reasons (protocol/money.py) -> the console's words
    ("negative", "money.error.negative"),
    ("more than 0", "money.error.zero"),
    ("at most", "money.error.too_much"),
    ("decimal places", "money.error.places"),
)


def amount_error(lang: str, reason: str, *, percent: bool = False, price: bool = False) -> str:
    if percent:
        return translate(lang, "money.error.percent")
    for fragment, key in _REASONS:
        if fragment in reason:
            return translate(lang, key, maximum=MAX_PRICE_YUAN if price else MAX_AMOUNT_YUAN)
    return translate(lang, "money.error.decimal")


def form_errors(lang: str, exc: ValidationError, fields: Mapping[str, str]) -> dict[str, str]:
    """Messages per form field for a money model's validation errors; ``fields`` maps the model's
    field names to the form's."""
    errors: dict[str, str] = {}
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else "form"
        field = fields.get(name, name)
        if error["type"] in ("missing", "string_too_short"):
            message = translate(lang, "error.required")
        elif error["type"] == "string_too_long":
            message = translate(lang, "error.too_long")
        else:
            message = amount_error(
                lang, error["msg"], percent=name == "fee_percent", price=name == "price_per_hour_yuan"
            )
        errors.setdefault(field, message)
    return errors
