"""Small line charts as SVG path data: a series of ``(x, y)`` points in, ``d`` out.

Pure: the dashboard draws an instance's recent RTT and ReachScore server-side as inline
SVG (no JavaScript, works offline); this module only maps values into the box. A ``None``
value is a gap: the line stops and starts again after it (a failed probe has no RTT).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Box:
    """The drawing area in SVG units (y grows downwards, as SVG's does)."""

    width: float
    height: float
    pad: float = 2.0

    def __post_init__(self) -> None:
        if not (self.width > 2 * self.pad and self.height > 2 * self.pad):
            raise ValueError("the box must be larger than its padding on both axes")


def y_top(values: Sequence[float | None], floor: float = 1.0) -> float:
    """The top of the y axis: the largest value plus a tenth, at least ``floor``."""
    present = [v for v in values if v is not None]
    return max([floor, *(v * 1.1 for v in present)])


def path(
    points: Sequence[tuple[float, float | None]],
    box: Box,
    y_range: tuple[float, float],
    x_range: tuple[float, float] | None = None,
) -> str:
    """SVG path data for ``points`` (``"M x y L x y ..."``), a new ``M`` after each gap.

    ``x_range`` defaults to the points' own; a zero-width range puts them in the middle.
    Values outside ``y_range`` are clamped to its edges. A lone point between gaps is
    drawn as a dot-sized segment (``h0.01``) so that it shows with a round line cap.
    """
    if not points:
        return ""
    lo_y, hi_y = y_range
    if not hi_y > lo_y:
        raise ValueError(f"y_range must grow: {y_range!r}")
    xs = [x for x, _ in points]
    lo_x, hi_x = x_range if x_range is not None else (min(xs), max(xs))
    inner_w, inner_h = box.width - 2 * box.pad, box.height - 2 * box.pad

    def sx(x: float) -> float:
        if hi_x <= lo_x:
            return box.pad + inner_w / 2
        return box.pad + (x - lo_x) / (hi_x - lo_x) * inner_w

    def sy(y: float) -> float:
        clamped = min(max(y, lo_y), hi_y)
        return box.pad + (hi_y - clamped) / (hi_y - lo_y) * inner_h

    parts: list[str] = []
    run = 0  # points in the current segment
    for x, y in points:
        if y is None:
            if run == 1:
                parts.append("h0.01")
            run = 0
            continue
        parts.append(f"{'L' if run else 'M'}{_n(sx(x))} {_n(sy(y))}")
        run += 1
    if run == 1:
        parts.append("h0.01")
    return " ".join(parts)


def _n(value: float) -> str:
    text = f"{value:.1f}"
    return "0.0" if text == "-0.0" else text
