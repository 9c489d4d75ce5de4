"""The one rule people read amounts by (protocol/money.py `money_text`)."""

from __future__ import annotations

import pytest

from sxwl.protocol.money import money_text


@pytest.mark.parametrize(
    ("micro", "text"),
    [
        (0, "0.00"),
        (1, "0.000001"),
        (71, "0.000071"),
        (331, "0.00033"),
        (5_000, "0.0050"),
        (10_000, "0.01"),
        (12_345, "0.01"),
        (500_000, "0.50"),
        (1_234_567, "1.23"),
        (-331, "-0.00033"),
        (-20_000, "-0.02"),
    ],
)
def test_small_amounts_keep_two_significant_digits_and_others_two_places(micro: int, text: str) -> None:
    assert money_text(micro) == text
