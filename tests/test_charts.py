"""``rollouts.web.charts``: pure functions from numbers to shapes, and the SVG partials that draw them."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from django.template.loader import render_to_string

from rollouts.web import charts

SCRIPT = "<script>alert(1)</script>"


# -- bin edges and buckets ---------------------------------------------------------------------
def test_equal_width_edges_split_the_range_and_end_exactly_on_the_top():
    assert charts.equal_width_edges(0.0, 1.0, 4) == [0.0, 0.25, 0.5, 0.75, 1.0]
    edges = charts.equal_width_edges(0.1, 0.7, 3)
    assert len(edges) == 4 and edges[0] == 0.1 and edges[-1] == 0.7


def test_one_value_gives_one_degenerate_bin():
    assert charts.equal_width_edges(3.0, 3.0, 10) == [3.0, 3.0]
    assert charts.histogram([0.5]) == [(0.5, 0.5, 1)]
    assert charts.histogram([2.0, 2.0, 2.0], bins=5) == [(2.0, 2.0, 3)]


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        charts.equal_width_edges(0, 1, 0)
    with pytest.raises(ValueError):
        charts.equal_width_edges(1, 0, 3)
    with pytest.raises(ValueError):
        charts.equal_width_edges(0, math.inf, 3)


def test_a_value_on_an_inner_edge_goes_up_and_the_top_edge_joins_the_last_bin():
    edges = [0.0, 0.25, 0.5, 0.75, 1.0]
    assert charts.bin_index(0.0, edges) == 0
    assert charts.bin_index(0.25, edges) == 1
    assert charts.bin_index(0.7499, edges) == 2
    assert charts.bin_index(1.0, edges) == 3
    assert charts.bin_index(-0.01, edges) is None and charts.bin_index(1.01, edges) is None
    assert charts.bin_index(math.nan, edges) is None


def test_histogram_counts_every_finite_value_once():
    values = [0.0, 0.1, 0.5, 0.99, 1.0, 1.0, math.nan, None]
    bins = charts.histogram(values, bins=2)
    assert bins == [(0.0, 0.5, 2), (0.5, 1.0, 4)]
    assert charts.histogram([]) == [] and charts.histogram([math.nan]) == []


def test_one_two_five_edges_cover_the_range_in_round_steps():
    assert charts.one_two_five_edges(200, 200) == [200.0, 500.0]
    assert charts.one_two_five_edges(0.3, 1234) == [0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    assert charts.one_two_five_edges(1, 1) == [1.0, 2.0]
    with pytest.raises(ValueError):
        charts.one_two_five_edges(0, 10)


def test_nice_ticks_are_round_and_span_the_range():
    assert charts.nice_ticks(0, 1, 5) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert charts.nice_ticks(0, 37, 4) == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert charts.nice_ticks(0, 0) == [0.0, 1.0]
    assert charts.nice_ticks(3, 3) == [3.0]


def test_time_steps_are_round_and_keep_buckets_few():
    assert charts.time_step(0) == 1
    assert charts.time_step(59, 30) == 2
    assert charts.time_step(3600, 30) == 300
    assert charts.time_step(86400 * 3, 30) == 3 * 3600
    big = charts.time_step(10**9, 30)
    assert big % (7 * 86400) == 0 and 10**9 / big < 30


def test_labels_read_like_units():
    assert charts.format_ms(0.5) == "0.5 ms" and charts.format_ms(200) == "200 ms"
    assert (
        charts.format_ms(2500) == "2.5 s"
        and charts.format_ms(120_000) == "2 min"
        and charts.format_ms(7_200_000) == "2 h"
    )
    assert (
        charts.format_number(1234) == "1,234"
        and charts.format_number(0.12345) == "0.123"
        and charts.format_number(None) == "—"
    )
    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert charts.time_label(moment, 5) == "03:04:05"
    assert charts.time_label(moment, 300) == "03:04"
    assert charts.time_label(moment, 86400) == "2026-01-02"


# -- shapes ------------------------------------------------------------------------------------
def test_bars_sit_on_the_baseline_and_the_tallest_reaches_its_round_top():
    chart = charts.bar_chart([("a", 1), ("b", 4), ("c", 0)], id="t", title="t")
    f = chart.frame
    assert len(chart.bars) == 3
    for bar in chart.bars:
        assert bar.y + bar.height == pytest.approx(f.bottom, abs=0.01)
        assert f.left <= bar.x and bar.x + bar.width <= f.right + 0.01
    assert chart.bars[1].height == pytest.approx(f.plot_height)  # 4 is a round top tick
    assert chart.bars[2].height == 0
    assert [t.text for t in chart.y_ticks][-1] == "4"
    assert chart.bars[0].title == "a: 1" and chart.rows == [("a", 1), ("b", 4), ("c", 0)]


def test_an_empty_chart_says_so_instead_of_drawing():
    assert charts.bar_chart([], id="t", title="t").empty
    assert charts.line_chart([], id="t", title="t").empty
    assert charts.line_chart([("s", [])], id="t", title="t").empty
    assert charts.stacked_bar_chart([], id="t", title="t").empty
    assert charts.stacked_bar_chart([("09:00", {})], id="t", title="t").empty


def test_a_line_with_one_point_is_centred_and_the_y_range_is_kept():
    chart = charts.line_chart([("pass@k", [(1, 0.5)])], id="t", title="t", y_range=(0, 1))
    (point,) = chart.series[0].points
    assert point.x == pytest.approx(chart.frame.center_x)
    assert point.y == pytest.approx(chart.frame.center_y)
    assert chart.y_ticks[0].text == "0" and chart.y_ticks[-1].text == "1"


def test_line_points_climb_with_their_values_and_the_table_holds_every_series():
    chart = charts.line_chart(
        [("a", [(1, 0.2), (2, 0.6), (3, 1.0)]), ("b", [(1, 0.1), (3, 0.3)])],
        id="t",
        title="t",
        x_label="k",
        y_range=(0, 1),
        dashed=[False, True],
    )
    ys = [p.y for p in chart.series[0].points]
    assert ys == sorted(ys, reverse=True)  # higher value, smaller y
    assert chart.series[1].dashed and not chart.series[0].dashed
    assert chart.series[0].path.count(",") == 3
    assert chart.rows == [("1", [0.2, 0.1]), ("2", [0.6, None]), ("3", [1.0, 0.3])]
    assert chart.series[0].points[0].title == "a, k 1: 0.2"


def test_stacked_segments_add_up_to_the_column_and_series_keep_one_colour():
    chart = charts.stacked_bar_chart([("t0", {"x": 2, "y": 1}), ("t1", {"y": 3})], id="t", title="t")
    assert chart.legend == [(0, "y"), (1, "x")]  # the largest total first
    first, second = chart.columns
    assert sum(s.height for s in first.segments) == pytest.approx(chart.frame.plot_height * 3 / chart.columns[1].total)
    assert [s.series for s in first.segments] == [0, 1] and [s.series for s in second.segments] == [0]
    assert first.segments[0].y + first.segments[0].height == pytest.approx(chart.frame.bottom)
    assert first.segments[1].y + first.segments[1].height == pytest.approx(first.segments[0].y)
    assert chart.rows == [("t0", [1, 2], 3), ("t1", [3, 0], 3)]


def test_crowded_axis_labels_are_thinned():
    items = [(f"label number {i}", i) for i in range(40)]
    chart = charts.bar_chart(items, id="t", title="t")
    assert 1 < len(chart.x_ticks) < 40 and chart.x_ticks[0].text == "label number 0"
    assert len(chart.bars) == 40


def test_colours_come_from_indices_never_from_labels():
    chart = charts.stacked_bar_chart([("t", {f"k{i}": 1 for i in range(10)})], id="t", title="t")
    assert {s.series for s in chart.columns[0].segments} == set(range(charts.PALETTE_SIZE))


# -- drawing: escaped text, numbers only in attributes ------------------------------------------
def _render(name, chart):
    return render_to_string(f"rollouts/partials/{name}.html", {"chart": chart})


def test_labels_are_escaped_in_every_chart_partial():
    evil = f'{SCRIPT}"><img src=x onerror=alert(1)>'
    drawn = [
        _render("chart_bar", charts.bar_chart([(evil, 3)], id="a", title=evil, desc=evil, x_label=evil, y_label=evil)),
        _render(
            "chart_line",
            charts.line_chart([(evil, [(1, 0.5), (2, 1.0)])], id="b", title=evil, x_label=evil, y_range=(0, 1)),
        ),
        _render("chart_stacked", charts.stacked_bar_chart([(evil, {evil: 2})], id="c", title=evil, x_label=evil)),
    ]
    for html in drawn:
        assert "<script>" not in html and "<img" not in html
        assert "&lt;script&gt;" in html
        assert "<title" in html and "<desc" in html and "<table" in html  # a title and the numbers as a table


def test_svg_coordinates_are_plain_numbers():
    html = _render("chart_bar", charts.bar_chart([("a", 1.5), ("b", 3)], id="a", title="t"))
    assert 'role="img"' in html and 'aria-labelledby="chart-a-title chart-a-desc"' in html
    import re

    values = re.findall(r' (?:x|y|width|height|x1|x2|y1|y2)="([^"]*)"', html)
    assert values
    for value in values:
        float(value)
