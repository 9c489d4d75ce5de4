"""``sxwl admin top-up | payout | prices | ledger``: money on the server's own database, through the
same services as the API (docs/billing.md). What changes money is recorded with the admin named by
``--as`` (or SXWL_ADMIN_EMAIL) and the time, like an admin's call to the API.

The cloud's modules (the database's models, the services) are imported in the commands that use
them, as in admin_models.py: every ``sxwl`` command would otherwise load them first (over a second
of CPU), the client's commands included."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from sxwl.cli.client import CliError
from sxwl.cli.cloud_settings import settings_for
from sxwl.cli.output import out
from sxwl.protocol.money import (
    MAX_AMOUNT_YUAN,
    MAX_PRICE_YUAN,
    money_text,
    parse_percent,
    parse_yuan,
    percent_text,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from sxwl.cloud.context import CloudContext
    from sxwl.cloud.db.models import User
    from sxwl.cloud.db.money_models import PriceResource
    from sxwl.cloud.errors import AppError

prices_app = typer.Typer(
    help="Prices per GPU-hour (per GPU product) and per CPU core-hour, with the platform's fee."
)
ledger_app = typer.Typer(help="The double-entry ledger of every money movement.", no_args_is_help=True)

DataDir = Annotated[
    Path, typer.Option("--data-dir", envvar="SXWL_DATA_DIR", help="Where the database and keys live.")
]
Actor = Annotated[
    str,
    typer.Option(
        "--as",
        envvar="SXWL_ADMIN_EMAIL",
        help="The admin account this action is recorded under (default: SXWL_ADMIN_EMAIL).",
        show_default=False,
    ),
]
Amount = Annotated[str, typer.Option("--amount", help="CNY, a decimal such as 100 or 7.20.")]
# Flags as the services name the fields, so that their errors name the flag.
FLAGS = {
    "user_id": "--email/--user-id",
    "provider_id": "--email",
    "amount_yuan": "--amount",
    "product": "--product",
}


@contextmanager
def database(data_dir: Path) -> Iterator[CloudContext]:
    """The cloud's database (migrated), as `sxwl admin create-user` opens it."""
    from sxwl.cloud.context import CloudContext
    from sxwl.cloud.db import migrate
    from sxwl.cloud.errors import AppError

    ctx = CloudContext.from_settings(settings_for(data_dir))
    migrate.upgrade(ctx.db.engine)
    try:
        yield ctx
    except AppError as exc:
        raise CliError(_flagged(exc), exit_code=2 if exc.status == 422 else 1) from None
    finally:
        ctx.db.dispose()


def _flagged(exc: AppError) -> str:
    field = exc.details[0].get("field") if isinstance(exc.details, list) and exc.details else None
    if isinstance(field, str) and field in FLAGS:
        return exc.message.replace(f"{field}:", f"{FLAGS[field]}:", 1)
    return exc.message


def _yuan(flag: str, text: str, maximum: Decimal = MAX_AMOUNT_YUAN, allow_zero: bool = False) -> int:
    try:
        return parse_yuan(text, maximum=maximum, allow_zero=allow_zero)
    except ValueError as exc:
        raise CliError(f"{flag}: {exc}", exit_code=2) from None


def _text(flag: str, value: str | None, maximum: int) -> None:
    """The API's bounds on free text (api/money_schemas.py), so the database never refuses it."""
    if value is not None and len(value) > maximum:
        raise CliError(f"{flag}: at most {maximum} characters", exit_code=2)
    if value is not None and flag != "--note" and not value.strip():
        raise CliError(f"{flag}: must not be empty", exit_code=2)


def _account(session: Session, flag: str, email: str) -> User:
    from sxwl.cloud.services.accounts import accounts

    user = accounts.find_by_email(session, email.strip().lower())
    if user is None:
        raise CliError(f"{flag}: no account {email}", exit_code=2)
    return user


def _admin(session: Session, email: str) -> User:
    from sxwl.cloud.db.models import Role

    if not email:
        raise CliError("--as: name the admin this is recorded under (or set SXWL_ADMIN_EMAIL)", exit_code=2)
    admin = _account(session, "--as", email)
    if admin.role != Role.ADMIN:
        raise CliError(f"--as: {email} is not an admin", exit_code=2)
    return admin


@contextmanager
def _acting(data_dir: Path, actor: str, *, immediate: bool = False) -> Iterator[tuple[Session, User]]:
    with database(data_dir) as ctx, ctx.db.session(immediate=immediate) as session:
        yield session, _admin(session, actor)


def top_up(
    amount: Amount,
    email: Annotated[str | None, typer.Option("--email", help="The user's email.")] = None,
    user_id: Annotated[
        str | None, typer.Option("--user-id", help="The user's id (instead of --email).")
    ] = None,
    note: Annotated[str, typer.Option("--note", help="Why (kept with the top-up).")] = "",
    key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Repeating a key adds nothing the second time.")
    ] = None,
    actor: Actor = "",
    data_dir: DataDir = Path(".sxwl"),
) -> None:
    """Add money to a compute user's balance (there is no payment gateway yet)."""
    from sxwl.cloud.services.money import billing, ledger

    if (email is None) == (user_id is None):
        raise CliError("--email or --user-id: give exactly one", exit_code=2)
    micro = _yuan("--amount", amount)
    _text("--note", note, 500)
    _text("--idempotency-key", key, 100)
    with _acting(data_dir, actor) as (session, admin):
        target = _account(session, "--email", email).id if email is not None else str(user_id)
        billing.top_up(session, admin, user_id=target, amount=micro, note=note, idempotency_key=key)
        balance = ledger.balance(session, ledger.account_key(ledger.USER_CASH, target))
    out.print(f"topped up {money_text(micro)} CNY; balance now {money_text(balance)} CNY")


def payout(
    email: Annotated[str, typer.Option("--email", help="The provider's email.")],
    amount: Amount,
    reference: Annotated[str, typer.Option("--reference", help="The transfer's reference, e.g. a bank's.")],
    key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Repeating a key pays nothing the second time.")
    ] = None,
    actor: Actor = "",
    data_dir: DataDir = Path(".sxwl"),
) -> None:
    """Record money paid to a provider, out of its available earnings."""
    from sxwl.cloud.services.money import earnings, ledger

    micro = _yuan("--amount", amount)
    _text("--reference", reference, 500)
    _text("--idempotency-key", key, 100)
    with _acting(data_dir, actor, immediate=True) as (session, admin):
        provider = _account(session, "--email", email)
        earnings.payout(
            session, admin, provider_id=provider.id, amount=micro, reference=reference, idempotency_key=key
        )
        left = ledger.balance(session, ledger.account_key(ledger.PROVIDER_AVAILABLE, provider.id))
    out.print(f"paid out {money_text(micro)} CNY to {email}; {money_text(left)} CNY still available")


@prices_app.callback(invoke_without_command=True)
def list_prices(ctx: typer.Context, data_dir: DataDir = Path(".sxwl")) -> None:
    """The prices in force (without a subcommand)."""
    from sxwl.cloud.db.models import User
    from sxwl.cloud.db.money_models import PriceResource
    from sxwl.cloud.services.money import prices

    if ctx.invoked_subcommand is not None:
        return
    with database(data_dir) as cloud, cloud.db.session() as session:
        rows = [
            (r, session.get(User, r.updated_by_id) if r.updated_by_id else None)
            for r in prices.listing(session)
        ]
        if not rows:
            out.print("No prices yet: nothing is placed until one is set (`sxwl admin prices set`).")
            return
        table = Table("resource", "product", "CNY per unit", "fee %", "set at (UTC)", "by")
        for row, by in rows:
            table.add_row(
                row.resource.value,
                row.product or ("saved workspaces" if row.resource == PriceResource.STORAGE else "CPU cores"),
                f"{money_text(row.price_per_hour)} / {prices.UNITS[row.resource]}",
                percent_text(row.fee_bp),
                row.updated_at.strftime("%Y-%m-%d %H:%M"),
                by.email if by else "-",
            )
    out.print(table)


@prices_app.command("set")
def set_price(
    price: Annotated[
        str,
        typer.Option(
            "--price", help="CNY per GPU-hour (per core-hour with --cpu, per GiB-day with --storage)."
        ),
    ],
    fee: Annotated[
        str, typer.Option("--fee", help="The platform's fee in percent (0-100; --storage: always 100).")
    ] = "",
    product: Annotated[str, typer.Option("--product", help="GPU product, as CPods report it.")] = "",
    cpu: Annotated[bool, typer.Option("--cpu", help="The price per CPU core-hour of CPU-only work.")] = False,
    storage: Annotated[
        bool,
        typer.Option("--storage", help="The price per GiB-day of paused dev environments' saved workspaces."),
    ] = False,
    actor: Actor = "",
    data_dir: DataDir = Path(".sxwl"),
) -> None:
    """Set a price; attempts already placed keep the price they were placed at."""
    from sxwl.cloud.db.money_models import PriceResource
    from sxwl.cloud.services.money import prices

    resource = _resource(product, cpu, storage)
    micro = _yuan("--price", price, MAX_PRICE_YUAN, allow_zero=True)
    if resource != PriceResource.STORAGE and not fee:
        raise CliError("--fee: give the platform's fee in percent", exit_code=2)
    try:
        fee_bp = parse_percent(fee) if resource != PriceResource.STORAGE else 10_000
    except ValueError as exc:
        raise CliError(f"--fee: {exc}", exit_code=2) from None
    with _acting(data_dir, actor) as (session, admin):
        prices.set_price(session, admin, resource=resource, product=product, rate=prices.Rate(micro, fee_bp))
    unit = {PriceResource.CPU: "CPU core-hour", PriceResource.STORAGE: "GiB-day of saved workspace"}.get(
        resource, f"GPU-hour of {product}"
    )
    out.print(f"{money_text(micro)} CNY per {unit}, fee {percent_text(fee_bp)} %")


def _resource(product: str, cpu: bool, storage: bool) -> PriceResource:
    from sxwl.cloud.db.money_models import PriceResource

    if bool(product) + cpu + storage != 1:
        raise CliError("--product, --cpu or --storage: give exactly one", exit_code=2)
    return PriceResource.CPU if cpu else PriceResource.STORAGE if storage else PriceResource.GPU


@prices_app.command("remove")
def remove_price(
    product: Annotated[str, typer.Option("--product", help="GPU product whose price is removed.")] = "",
    cpu: Annotated[bool, typer.Option("--cpu", help="Remove the CPU core-hour price.")] = False,
    storage: Annotated[bool, typer.Option("--storage", help="Remove the storage price (then free).")] = False,
    actor: Actor = "",
    data_dir: DataDir = Path(".sxwl"),
) -> None:
    """Remove a price: work on it is not placed until it is priced again (saved workspaces: free)."""
    from sxwl.cloud.services.money import prices

    resource = _resource(product, cpu, storage)
    with _acting(data_dir, actor) as (session, admin):
        prices.set_price(session, admin, resource=resource, product=product, rate=None)
    out.print(f"removed the price of {product or ('saved workspaces' if storage else 'CPU cores')}")


@ledger_app.command("check")
def check_ledger(data_dir: DataDir = Path(".sxwl")) -> None:
    """Prove every transaction sums to zero and every cached balance equals its entries; exit 1 if not."""
    from sxwl.cloud.services.money import ledger

    with database(data_dir) as ctx, ctx.db.session() as session:
        report = ledger.check(session)
    out.print(f"{report.transactions} transactions, {report.entries} entries")
    for key in report.unbalanced:
        out.print(f"[red]unbalanced transaction[/] {key}")
    for account, cached, summed in report.mismatched:
        out.print(
            f"[red]cached balance differs[/] {account}: cached {cached}, entries sum to {summed} (micro-yuan)"
        )
    for key in report.unlined:
        out.print(f"[red]usage lines (a storage charge) differ from their transaction[/] {key}")
    if not report.ok:
        raise CliError(
            f"the ledger does not balance: {len(report.unbalanced)} transaction(s), "
            f"{len(report.mismatched)} account(s), {len(report.unlined)} usage transaction(s)"
        )
    out.print("[green]ok[/]: every transaction balances and every cached balance matches its entries")


def register(admin_app: typer.Typer) -> None:
    admin_app.command("top-up")(top_up)
    admin_app.command("payout")(payout)
    admin_app.add_typer(prices_app, name="prices")
    admin_app.add_typer(ledger_app, name="ledger")
