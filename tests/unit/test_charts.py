"""reach.core.ops.charts: series to SVG path data, gaps, clamping, degenerate ranges."""

from __future__ import annotations

import pytest

from reach.core.ops.charts import Box, path, y_top

BOX = Box(width=104, height=54, pad=2)  # inner 100 x 50


@pytest.mark.parametrize(
    ("points", "y_range", "x_range", "expected"),
    [
        ([], (0, 10), None, ""),
        # two points span the box: left-bottom to right-top
        ([(0, 0), (10, 10)], (0, 10), None, "M2.0 52.0 L102.0 2.0"),
        # a middle value lands mid-height
        ([(0, 5), (1, 5)], (0, 10), None, "M2.0 27.0 L102.0 27.0"),
        # a gap starts a new segment; a lone point becomes a dot
        (
            [(0, 0), (1, None), (2, 10), (3, 10)],
            (0, 10),
            None,
            "M2.0 52.0 h0.01 M68.7 2.0 L102.0 2.0",
        ),
        ([(0, None), (1, None)], (0, 10), None, ""),
        # out-of-range values are clamped to the edges
        ([(0, -5), (1, 50)], (0, 10), None, "M2.0 52.0 L102.0 2.0"),
        # a single x: in the middle
        ([(7, 10)], (0, 10), None, "M52.0 2.0 h0.01"),
        # an explicit x range leaves room on the left
        ([(5, 0), (10, 0)], (0, 10), (0, 10), "M52.0 52.0 L102.0 52.0"),
    ],
)
def test_path(
    points: list[tuple[float, float | None]],
    y_range: tuple[float, float],
    x_range: tuple[float, float] | None,
    expected: str,
) -> None:
    assert path(points, BOX, y_range, x_range) == expected


@pytest.mark.parametrize(
    ("values", "floor", "expected"),
    [
        ([], 1.0, 1.0),
        ([None], 1.0, 1.0),
        ([10.0, None, 20.0], 1.0, 22.0),
        ([0.2], 1.0, 1.0),
        ([50.0], 100.0, 100.0),
    ],
)
def test_y_top(values: list[float | None], floor: float, expected: float) -> None:
    assert y_top(values, floor) == pytest.approx(expected)


@pytest.mark.parametrize(("y_range"), [(0, 0), (10, 0)])
def test_path_refuses_a_flat_y_range(y_range: tuple[float, float]) -> None:
    with pytest.raises(ValueError, match="y_range"):
        path([(0, 1)], BOX, y_range)


@pytest.mark.parametrize(("width", "height"), [(4, 50), (50, 4), (0, 0)])
def test_box_must_exceed_its_padding(width: float, height: float) -> None:
    with pytest.raises(ValueError, match="padding"):
        Box(width, height, pad=2)
