"""A fine-tune's loss chart as SVG geometry, drawn on the server (no script, no chart library: the
console's content security policy allows neither, and a fragment refresh redraws it): training
loss as a line, validation loss as a dashed line with dots, over the steps, with round ticks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Drawn at most per line: enough for the shape of a curve, bounded for a page refreshed often.
CHART_POINTS = 300


@dataclass(frozen=True)
class Tick:
    at: float  # the pixel position along the axis
    label: str


@dataclass(frozen=True)
class Chart:
    """A loss chart's geometry in the SVG's own units (``WIDTH`` × ``HEIGHT``)."""

    train_path: str
    eval_path: str
    eval_dots: list[tuple[float, float]]
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    last_train: float | None
    last_eval: float | None
    points: int

    # Wide enough that the SVG, scaled to a card's width, shows its labels at about the page's size.
    WIDTH = 960
    HEIGHT = 296
    LEFT = 56
    RIGHT = 20
    TOP = 16
    BOTTOM = 48

    @property
    def empty(self) -> bool:
        return not self.train_path and not self.eval_path

    @property
    def plot_right(self) -> int:
        return self.WIDTH - self.RIGHT

    @property
    def plot_bottom(self) -> int:
        return self.HEIGHT - self.BOTTOM


def _nice_step(span: float, count: int) -> float:
    raw = span / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * magnitude:
            return float(factor * magnitude)
    return float(10 * magnitude)  # pragma: no cover - the last factor always fits


def _label(value: float) -> str:
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def _thin(points: list[tuple[int, float]], most: int) -> list[tuple[int, float]]:
    """At most ``most`` of the points, evenly spread, the last one always kept."""
    if len(points) <= most:
        return points
    stride = len(points) / most
    kept = [points[int(i * stride)] for i in range(most - 1)]
    return [*kept, points[-1]]


def loss_chart(series: Sequence[tuple[int, float | None, float | None]], total_steps: int) -> Chart:
    """The chart of (step, training loss, validation loss) reports. A resumed attempt reports some
    steps again: the latest report of a step wins, so the curve is one line along the steps."""
    train: dict[int, float] = {}
    evals: dict[int, float] = {}
    for step, loss, eval_loss in series:
        if loss is not None and math.isfinite(loss):
            train[step] = loss
        if eval_loss is not None and math.isfinite(eval_loss):
            evals[step] = eval_loss
    train_points = _thin(sorted(train.items()), CHART_POINTS)
    eval_points = _thin(sorted(evals.items()), CHART_POINTS)
    values = [v for _, v in train_points + eval_points]
    if not values:
        return Chart("", "", [], [], [], None, None, 0)
    low, high = min(values), max(values)
    if high - low < 1e-9:
        low, high = low - 0.5, high + 0.5
    step_y = _nice_step(high - low, 4)
    low = math.floor(low / step_y) * step_y
    high = math.ceil(high / step_y) * step_y
    steps = [s for s, _ in train_points + eval_points]
    x_max = max(total_steps, max(steps), 1)
    x0, x1, y0, y1 = Chart.LEFT, Chart.WIDTH - Chart.RIGHT, Chart.HEIGHT - Chart.BOTTOM, Chart.TOP

    def x(step: float) -> float:
        return round(x0 + (x1 - x0) * step / x_max, 1)

    def y(value: float) -> float:
        return round(y0 - (y0 - y1) * (value - low) / (high - low), 1)

    def path(points: list[tuple[int, float]]) -> str:
        return " ".join(f"{'M' if i == 0 else 'L'}{x(s)},{y(v)}" for i, (s, v) in enumerate(points))

    step_x = _nice_step(x_max, 5)
    x_ticks = [Tick(x(t), _label(t)) for t in _range(0, x_max, step_x)]
    y_ticks = [Tick(y(t), _label(t)) for t in _range(low, high, step_y)]
    return Chart(
        train_path=path(train_points),
        eval_path=path(eval_points) if len(eval_points) > 1 else "",
        eval_dots=[(x(s), y(v)) for s, v in eval_points],
        x_ticks=x_ticks,
        y_ticks=y_ticks,
        last_train=train_points[-1][1] if train_points else None,
        last_eval=eval_points[-1][1] if eval_points else None,
        points=len(train_points) + len(eval_points),
    )


def _range(start: float, stop: float, step: float) -> list[float]:
    count = math.floor((stop - start) / step + 1e-6) if step > 0 else 0
    return [round(start + i * step, 9) for i in range(count + 1)]
