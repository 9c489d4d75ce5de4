"""Money at the boundaries: decimal yuan in, integer micro-yuan stored and sent (the API's integers
are micro-yuan unless a field says otherwise), and the words a statement rounds them to.

Micro-yuan are fine enough that one second of the cheapest GPU does not round away: 0.01 CNY per
GPU-hour is 2.8 micro-yuan per second."""

from __future__ import annotations

import re
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

MICRO = 1_000_000  # micro-yuan per yuan
US_PER_HOUR = 3_600_000_000  # microseconds
MAX_PRICE_YUAN = Decimal(100_000)  # per unit-hour: anything above is a typo
MAX_AMOUNT_YUAN = Decimal(100_000_000)  # one top-up or payout
# Text is plain decimal notation: Decimal alone would also take "1_000", full-width digits, and
# "1e-999999999999", which underflows to a price of 0.
_DECIMAL_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")


def _decimal(value: object, problem: str) -> Decimal:
    """The Decimal of a JSON number or of decimal text; ValueError(``problem``) otherwise."""
    if isinstance(value, bool) or not isinstance(value, str | int | float | Decimal):
        raise ValueError(problem)
    text = str(value).strip()
    if isinstance(value, str) and not _DECIMAL_TEXT.fullmatch(text):
        raise ValueError(problem)
    try:
        return Decimal(text)
    except InvalidOperation:
        raise ValueError(problem) from None


def parse_yuan(value: object, *, maximum: Decimal, allow_zero: bool) -> int:
    """Micro-yuan of a decimal amount given as text ("7.20") or a number; ValueError says why not."""
    amount = _decimal(value, "must be a decimal number of yuan, such as 7.20")
    if not amount.is_finite():
        raise ValueError("must be a finite number")
    if amount < 0:
        raise ValueError("must not be negative")
    if amount == 0 and not allow_zero:
        raise ValueError("must be more than 0")
    if amount > maximum:
        raise ValueError(f"must be at most {maximum}")
    micro = amount * MICRO
    if micro != micro.to_integral_value():
        raise ValueError("has more than 6 decimal places")
    return int(micro)


def parse_percent(value: object) -> int:
    """Basis points of a percentage between 0 and 100 with at most two decimals ("12.5")."""
    percent = _decimal(value, "must be a percentage between 0 and 100, such as 10")
    if not percent.is_finite() or not 0 <= percent <= 100:
        raise ValueError("must be between 0 and 100")
    basis_points = percent * 100
    if basis_points != basis_points.to_integral_value():
        raise ValueError("has more than 2 decimal places")
    return int(basis_points)


def yuan(micro: int) -> Decimal:
    """The exact decimal amount of ``micro`` micro-yuan."""
    return Decimal(micro) / MICRO


def yuan_text(micro: int, places: int = 2) -> str:
    """``micro`` rounded for people (half to even, so rounding errors do not drift one way); a debt
    smaller than the last place reads 0.00, not -0.00."""
    rounded = yuan(micro).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_EVEN)
    return str(abs(rounded) if rounded == 0 else rounded)


def money_text(micro: int) -> str:
    """The one way people read an amount, on every surface (console, CLI, statements): two places
    from 0.01 yuan up; below that, enough places for two significant digits (at most six, the
    micro-yuan), so a cheap job's ¥0.000331 never reads 0.00 beside a total that does not. CSV
    and the API carry the exact value instead."""
    magnitude = abs(micro)
    if magnitude == 0 or magnitude >= MICRO // 100:
        return yuan_text(micro)
    places = 2
    while places < 6 and magnitude * 10**places < 10 * MICRO:
        places += 1
    return yuan_text(micro, places)


def percent_text(basis_points: int) -> str:
    """ "12.5" for 1250 basis points; "10", not normalize()'s "1E+1", for 1000."""
    return f"{(Decimal(basis_points) / 100).normalize():f}"


def cost(units: int, price_per_hour: int, usage_us: int) -> int:
    """What ``usage_us`` microseconds of ``units`` units cost at ``price_per_hour`` micro-yuan per
    unit-hour, rounded down to a micro-yuan. Rated on the whole duration so far, never on a slice,
    so that passes do not accumulate rounding."""
    return units * price_per_hour * usage_us // US_PER_HOUR


def provider_share(gross: int, fee_bp: int) -> int:
    """The provider's part of ``gross`` after the platform's fee, rounded down: the platform keeps
    the fee and the rounding remainder."""
    return gross * (10_000 - fee_bp) // 10_000


# A price as the API and forms take it: decimal yuan, at most 6 places, 0 allowed.
YuanPrice = Annotated[
    int,
    BeforeValidator(lambda v: parse_yuan(v, maximum=MAX_PRICE_YUAN, allow_zero=True)),
    PlainSerializer(lambda micro: str(yuan(micro)), return_type=str),
]
# A top-up or payout: decimal yuan, more than 0.
YuanAmount = Annotated[
    int,
    BeforeValidator(lambda v: parse_yuan(v, maximum=MAX_AMOUNT_YUAN, allow_zero=False)),
    PlainSerializer(lambda micro: str(yuan(micro)), return_type=str),
]
FeePercent = Annotated[
    int,
    BeforeValidator(parse_percent),
    PlainSerializer(percent_text, return_type=str),
]
