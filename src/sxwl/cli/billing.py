"""``sxwl billing`` and ``sxwl earnings``: a user's balance and statements, a provider's earnings,
over the API. The API's integers are micro-yuan; people read them as ``money_text`` writes them (two
places, or two significant digits below a fen), the CSV carries them exact."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from sxwl.cli import client
from sxwl.cli.client import CliError
from sxwl.cli.output import listing, out, show
from sxwl.protocol.money import money_text

app = typer.Typer(help="Your balance, burn rate and monthly statements.", no_args_is_help=True)

Month = Annotated[str | None, typer.Option("--month", help="YYYY-MM (UTC); default: this month.")]
CsvFile = Annotated[
    Path | None, typer.Option("--csv", help="Save the month's lines as CSV to FILE instead of printing.")
]


def price_text(micro: int | None) -> str:
    return "— (no price)" if micro is None else f"{money_text(micro)} CNY"


def _params(month: str | None) -> dict[str, str]:
    if month is None:
        return {}
    if not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", month):
        raise CliError(f"--month {month!r}: expected YYYY-MM, such as 2026-12", exit_code=2)
    return {"month": month}


def _get(path: str, params: dict[str, str]) -> Any:
    try:
        return client.call("GET", path, params=params)
    except client.ApiError as exc:
        raise CliError(str(exc), exit_code=2 if exc.status == 422 else 1) from None


def _save_csv(path: str, month: str | None, target: Path) -> None:
    response = _get(path, {**_params(month), "format": "csv"})
    target.write_bytes(response.content)
    out.print(f"saved {max(0, response.text.count(chr(10)) - 1)} line(s) to {target}")


def lines_table(lines: list[dict[str, Any]], title: str, *, earned: bool) -> Table:
    """A statement's lines: what a user paid for each attempt, or (``earned``) a provider's gross,
    the platform's fee and the provider's net. A user's table reads no more than the amount paid,
    whatever else the API's line carries."""
    shares = ("gross", "fee", "net") if earned else ("charged",)
    headers = ("job", "name", "attempt", "GPU product", "unit-seconds", "CNY/hour", *shares)
    table = listing(*headers, ids=("job",), title=title)
    for line in lines:
        amounts = [line["gross"], line["fee"], line["net"]] if earned else [line["gross"]]
        table.add_row(
            line["job_id"][:12],  # a unique prefix, as `sxwl jobs show` takes it
            escape(line["job_name"] or ""),
            str(line["attempt"]),
            line["gpu_product"] or "CPU",
            f"{line['unit_seconds']:.0f}",
            money_text(line["unit_price"]),
            *(money_text(a) for a in amounts),
        )
    return table


@app.command()
def balance() -> None:
    """Your balance and what your running jobs cost per hour."""
    now = _get("/api/v1/billing/balance", {}).json()
    out.print(f"balance: [bold]{money_text(now['balance'])} CNY[/]")
    if now["running_attempts"]:
        left = f", about {now['hours_left']:.1f} h left" if now["hours_left"] is not None else ""
        warn = "  [yellow]low: less than an hour left[/]" if now["low"] else ""
        out.print(
            f"burning {money_text(now['burn_per_hour'])} CNY/hour on "
            f"{now['running_attempts']} running attempt(s){left}{warn}"
        )


@app.command()
def statement(month: Month = None, csv: CsvFile = None) -> None:
    """Your charges per job attempt in a month, and the month's top-ups."""
    if csv is not None:
        _save_csv("/api/v1/billing/statement", month, csv)
        return
    result = _get("/api/v1/billing/statement", _params(month)).json()
    if result["lines"]:
        show(lines_table(result["lines"], f"charges in {result['month']}", earned=False))
    else:
        out.print(f"No charges in {result['month']}.")
    for top_up in result["top_ups"]:
        note = f" ({escape(top_up['note'])})" if top_up["note"] else ""
        out.print(f"top-up {top_up['created_at'][:10]}: {money_text(top_up['amount'])} CNY{note}")
    out.print(f"total charged: [bold]{money_text(result['total'])} CNY[/]")


def earnings(month: Month = None, csv: CsvFile = None) -> None:
    """A provider's earnings: pending (held for disputes), available, paid out, and the month's lines."""
    if csv is not None:
        _save_csv("/api/v1/earnings", month, csv)
        return
    mine = _get("/api/v1/earnings", _params(month)).json()
    summary = Table(show_header=False, box=None)
    for label, key in (
        ("today", "today"),
        (f"{mine['month']} (net)", "month_net"),
        (f"{mine['month']} platform fee", "month_fee"),
        ("pending (on hold)", "pending"),
        ("available", "available"),
        ("paid out", "paid_out"),
    ):
        summary.add_row(label, f"{money_text(mine[key])} CNY")
    summary.add_row("GPU-hours sold", f"{mine['sold_gpu_hours']:.2f}")
    out.print(summary)
    if mine["lines"]:
        show(lines_table(mine["lines"], f"earnings in {mine['month']}", earned=True))
