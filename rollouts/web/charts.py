"""Small server-rendered charts: pure functions from numbers to shapes and coordinates.

No Django and no HTML here. The templates (``gymweb/templates/rollouts/partials/chart_*.html``) draw the
shapes as inline SVG, with every coordinate a number and every label or tooltip autoescaped text:
labels are untrusted (failure kinds, agent names), so nothing built here is ever marked safe, and
no label ever becomes an attribute name, a class name or markup. Series colours are chosen by
*index* (``series`` 0..PALETTE_SIZE-1, drawn as CSS classes ``s0``..``s7``), never by label.

Every chart carries its numbers as ``rows`` too, so a page can offer them as a table (the SVG's
``<title>`` and per-shape tooltips are the other accessible path).

Contents:

- binning: ``equal_width_edges``, ``bin_index``, ``histogram``, ``one_two_five_edges``
  (log-like "nice" edges for latencies), ``nice_ticks``, ``time_step``;
- labels: ``format_ms``, ``format_number``, ``time_label``;
- charts: ``bar_chart`` (a histogram or any labelled bars), ``line_chart`` (e.g. pass@k over k),
  ``stacked_bar_chart`` (e.g. failures by kind per time bucket).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

__all__ = [
    "PALETTE_SIZE",
    "Bar",
    "BarChart",
    "Column",
    "Frame",
    "LineChart",
    "Point",
    "Series",
    "StackedBarChart",
    "Tick",
    "bar_chart",
    "bin_index",
    "equal_width_edges",
    "format_ms",
    "format_number",
    "histogram",
    "line_chart",
    "nice_ticks",
    "one_two_five_edges",
    "stacked_bar_chart",
    "time_label",
    "time_step",
]

PALETTE_SIZE = 8
WIDTH = 560
HEIGHT = 200
MARGIN_LEFT = 48
MARGIN_RIGHT = 12
MARGIN_TOP = 12
MARGIN_BOTTOM = 36
CHAR_PX = 6.2  # rough width of one character of the 11px axis font, to thin crowded labels


def _r(x: float) -> float:
    """Coordinates are rounded to 0.01 px: short markup, stable tests."""
    return round(float(x), 2)


# ---------------------------------------------------------------------------------------------
# Binning and ticks
# ---------------------------------------------------------------------------------------------


def equal_width_edges(lo: float, hi: float, bins: int) -> list[float]:
    """``bins + 1`` equal-width edges from ``lo`` to ``hi`` (the last edge is ``hi`` exactly).
    When ``lo == hi`` there is one degenerate bin: ``[lo, hi]``. Raises ValueError for
    ``bins < 1``, ``hi < lo`` or a non-finite bound."""
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError("edges need finite bounds")
    if hi < lo:
        raise ValueError(f"hi ({hi}) is below lo ({lo})")
    if hi == lo:
        return [float(lo), float(hi)]
    return [float(lo) + (hi - lo) * i / bins for i in range(bins)] + [float(hi)]


def bin_index(value: float, edges: Sequence[float]) -> int | None:
    """The bin of ``value`` for ``edges`` (ascending): bins are ``[e_i, e_{i+1})`` except the last,
    which also holds its top edge. None when ``value`` lies outside ``[edges[0], edges[-1]]``."""
    if len(edges) < 2 or value is None or not math.isfinite(value):
        return None
    if value < edges[0] or value > edges[-1]:
        return None
    lo, hi = 0, len(edges) - 2
    while lo < hi:  # the last edge <= value among edges[0..n-2]
        mid = (lo + hi + 1) // 2
        if edges[mid] <= value:
            lo = mid
        else:
            hi = mid - 1
    return lo


def histogram(values: Sequence[float], bins: int = 10) -> list[tuple[float, float, int]]:
    """Equal-width histogram of ``values`` over their own range: ``[(low, high, count), ...]``.
    Empty for no values; one bin ``(v, v, n)`` when every value is equal. Non-finite values are
    left out. (Pages bin large data in SQL; this is the pure reference of the same rule.)"""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return []
    lo, hi = min(finite), max(finite)
    if lo == hi:
        return [(lo, hi, len(finite))]
    edges = equal_width_edges(lo, hi, bins)
    counts = [0] * bins
    for v in finite:
        counts[bin_index(v, edges)] += 1
    return [(edges[i], edges[i + 1], counts[i]) for i in range(bins)]


def one_two_five_edges(lo: float, hi: float) -> list[float]:
    """Edges 1, 2, 5, 10, 20, 50, ... (times powers of ten) covering ``[lo, hi]``: the first edge
    is the largest such number <= ``lo``, the last the smallest > ``hi``. For positive bounds only
    (latencies); raises ValueError otherwise."""
    if not (lo > 0 and hi > 0 and math.isfinite(lo) and math.isfinite(hi)) or hi < lo:
        raise ValueError("one_two_five_edges needs 0 < lo <= hi")
    exponent = math.floor(math.log10(lo))
    edges: list[float] = []
    while True:
        for m in (1, 2, 5):
            e = m * 10.0**exponent
            e = float(f"{e:.12g}")  # 0.1 * 3 noise away
            if e <= lo:
                edges = [e]
            elif edges:
                edges.append(e)
                if e > hi:
                    return edges
        exponent += 1


def _nice(x: float, round_up: bool) -> float:
    if x <= 0:
        return 0.0
    exp = math.floor(math.log10(x))
    f = x / 10**exp
    if round_up:
        nf = 1 if f <= 1 else 2 if f <= 2 else 5 if f <= 5 else 10
    else:
        nf = 1 if f < 1.5 else 2 if f < 3 else 5 if f < 7 else 10
    return nf * 10**exp


def nice_ticks(lo: float, hi: float, max_ticks: int = 5, min_step: float = 0.0) -> list[float]:
    """Round tick values (steps of 1, 2 or 5 times a power of ten) from <= ``lo`` to >= ``hi``,
    at most about ``max_ticks + 1`` of them, with a step of at least ``min_step`` (1 for counts).
    ``lo == hi`` gives ``[lo]`` (``[0, 1]`` for 0)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        return [0.0, 1.0] if lo == 0 else [float(lo)]
    step = max(_nice((hi - lo) / max(max_ticks, 1), round_up=True), min_step)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v < hi + step * 0.5:
        ticks.append(float(f"{v:.12g}") + 0.0)
        v += step
    if ticks[-1] < hi:
        ticks.append(float(f"{ticks[-1] + step:.12g}"))
    return ticks


_TIME_STEPS = (
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
    2 * 86400,
    7 * 86400,
    14 * 86400,
    28 * 86400,
)


def time_step(span_s: float, max_buckets: int = 30) -> int:
    """A round bucket width in seconds (1 s, 2 s, 5 s, … 30 min, 1 h, … 1 day, 1 week…) so that
    ``span_s`` fits in at most ``max_buckets`` buckets."""
    if max_buckets < 1:
        raise ValueError("max_buckets must be >= 1")
    span = max(float(span_s), 0.0)
    for step in _TIME_STEPS:
        if span / step < max_buckets:
            return step
    weeks = math.ceil(span / (7 * 86400) / max_buckets)
    return weeks * 7 * 86400


# ---------------------------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------------------------


def format_number(value: float | None, digits: int = 3) -> str:
    """A short label: integers as they are (thousands separated), others to ``digits``
    significant digits; ``—`` for None or NaN."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:.{digits}g}"


def format_ms(ms: float | None) -> str:
    """Milliseconds for an axis: ``0.5 ms``, ``200 ms``, ``1 s``, ``2.5 s``, ``2 min``, ``1 h``."""
    if ms is None or not math.isfinite(ms):
        return "—"
    if ms < 1000:
        return f"{ms:g} ms"
    s = ms / 1000
    if s < 60:
        return f"{s:g} s"
    if s < 3600:
        return f"{s / 60:g} min"
    return f"{s / 3600:g} h"


def time_label(moment: datetime, step_s: int) -> str:
    """A bucket's start for an axis: ``HH:MM:SS`` for steps under a minute, ``HH:MM`` under a
    day, ``YYYY-MM-DD`` from a day (the caller converts to the wanted time zone first)."""
    if step_s < 60:
        return moment.strftime("%H:%M:%S")
    if step_s < 86400:
        return moment.strftime("%H:%M")
    return moment.strftime("%Y-%m-%d")


# ---------------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """The SVG canvas (``width`` × ``height``) and its plot area."""

    width: int = WIDTH
    height: int = HEIGHT
    left: int = MARGIN_LEFT
    right: int = WIDTH - MARGIN_RIGHT
    top: int = MARGIN_TOP
    bottom: int = HEIGHT - MARGIN_BOTTOM

    @property
    def plot_width(self) -> float:
        return self.right - self.left

    @property
    def plot_height(self) -> float:
        return self.bottom - self.top

    @property
    def label_y(self) -> float:
        """Baseline of the x-axis labels."""
        return self.bottom + 14

    @property
    def title_y(self) -> float:
        """Baseline of the x-axis title."""
        return self.height - 4

    @property
    def center_x(self) -> float:
        return self.left + self.plot_width / 2

    @property
    def center_y(self) -> float:
        return self.top + self.plot_height / 2

    @property
    def tick_x(self) -> float:
        """Right edge of the y-axis labels."""
        return self.left - 6


def _frame(width: int, height: int) -> Frame:
    return Frame(width=width, height=height, right=width - MARGIN_RIGHT, bottom=height - MARGIN_BOTTOM)


@dataclass(frozen=True)
class Tick:
    """An axis tick at ``pos`` (px along its axis) with its label ``text``."""

    pos: float
    text: str


@dataclass(frozen=True)
class Bar:
    """One rectangle; ``title`` is its tooltip, ``series`` its colour index."""

    x: float
    y: float
    width: float
    height: float
    value: float
    label: str
    title: str
    series: int = 0


def _y_axis(frame: Frame, top_value: float, fmt=format_number, counts: bool = False) -> tuple[list[Tick], float]:
    """Ticks for 0..``top_value`` and the value the plot's top stands for (whole steps for counts)."""
    ticks = nice_ticks(0.0, top_value if top_value > 0 else 1.0, 4, min_step=1.0 if counts else 0.0)
    top = ticks[-1] or 1.0
    return [Tick(_r(frame.bottom - frame.plot_height * t / top), fmt(t)) for t in ticks], top


def _all_whole(values: Iterable[float]) -> bool:
    """True when every value is a whole number (counts): their axis gets whole ticks only."""
    return all(float(v).is_integer() for v in values)


def _thin(labels: list[Tick], slot_px: float) -> list[Tick]:
    """Keep every n-th label so that they do not overlap (the first is always kept)."""
    if not labels:
        return labels
    widest = max(len(t.text) for t in labels) * CHAR_PX + 6
    every = max(1, math.ceil(widest / max(slot_px, 1.0)))
    return [t for i, t in enumerate(labels) if i % every == 0]


@dataclass
class BarChart:
    """Labelled bars over a shared zero line. ``rows`` = ``[(label, value)]`` for a table."""

    id: str
    title: str
    desc: str
    frame: Frame
    bars: list[Bar] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    x_label: str = ""
    y_label: str = ""
    rows: list[tuple[str, float]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.bars


def bar_chart(
    items: Sequence[tuple[str, float]],
    *,
    id: str,
    title: str,
    desc: str = "",
    x_label: str = "",
    y_label: str = "",
    width: int = WIDTH,
    height: int = HEIGHT,
    value_format=format_number,
    series: Sequence[int] | None = None,
) -> BarChart:
    """Bars for ``items`` = ``[(label, value >= 0)]`` in order, scaled so the largest reaches a
    round top tick. Each bar's tooltip reads ``"<label>: <value>"``. ``series`` optionally gives
    each bar a colour index. Empty ``items`` give a chart with ``empty`` True (draw a note)."""
    frame = _frame(width, height)
    chart = BarChart(
        id=id,
        title=title,
        desc=desc,
        frame=frame,
        x_label=x_label,
        y_label=y_label,
        rows=[(label, value) for label, value in items],
    )
    if not items:
        return chart
    chart.y_ticks, top = _y_axis(
        frame, max(float(v) for _, v in items), value_format, counts=_all_whole(v for _, v in items)
    )
    slot = frame.plot_width / len(items)
    gap = min(4.0, slot * 0.15)
    labels = []
    for i, (label, value) in enumerate(items):
        h = frame.plot_height * max(float(value), 0.0) / top
        x = frame.left + i * slot
        chart.bars.append(
            Bar(
                x=_r(x + gap / 2),
                y=_r(frame.bottom - h),
                width=_r(max(slot - gap, 1.0)),
                height=_r(h),
                value=value,
                label=label,
                title=f"{label}: {value_format(value)}",
                series=(series[i] if series else 0) % PALETTE_SIZE,
            )
        )
        labels.append(Tick(_r(x + slot / 2), label))
    chart.x_ticks = _thin(labels, slot)
    return chart


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    title: str


@dataclass
class Series:
    """One line: ``points`` (px) and ``path`` (the ``points`` attribute of a polyline)."""

    name: str
    index: int
    points: list[Point] = field(default_factory=list)
    dashed: bool = False

    @property
    def path(self) -> str:
        return " ".join(f"{p.x:g},{p.y:g}" for p in self.points)


@dataclass
class LineChart:
    id: str
    title: str
    desc: str
    frame: Frame
    series: list[Series] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    x_label: str = ""
    y_label: str = ""
    # a table: header cells and rows of (x label, one value per series)
    columns: list[str] = field(default_factory=list)
    rows: list[tuple[str, list[float | None]]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not any(s.points for s in self.series)


def line_chart(
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    *,
    id: str,
    title: str,
    desc: str = "",
    x_label: str = "",
    y_label: str = "",
    y_range: tuple[float, float] | None = None,
    width: int = WIDTH,
    height: int = HEIGHT,
    dashed: Sequence[bool] = (),
    x_format=format_number,
    y_format=format_number,
) -> LineChart:
    """Lines through ``series`` = ``[(name, [(x, y), ...]), ...]`` on shared axes. ``y_range``
    fixes the y axis (e.g. ``(0, 1)`` for fractions); otherwise it spans 0..the largest y.
    A single x value sits in the middle. ``dashed[i]`` draws series i dashed. Every point's
    tooltip reads ``"<name>, <x_label> <x>: <y>"``."""
    frame = _frame(width, height)
    chart = LineChart(
        id=id,
        title=title,
        desc=desc,
        frame=frame,
        x_label=x_label,
        y_label=y_label,
        columns=[name for name, _ in series],
    )
    xs = sorted({float(x) for _, pts in series for x, _ in pts})
    ys = [float(y) for _, pts in series for _, y in pts]
    if not xs:
        chart.series = [Series(name=name, index=i % PALETTE_SIZE) for i, (name, _) in enumerate(series)]
        return chart
    y_lo, y_hi = y_range if y_range else (0.0, max(ys) if ys else 1.0)
    if y_hi <= y_lo:
        y_hi = y_lo + 1.0
    ticks = nice_ticks(y_lo, y_hi, 5)
    if y_range:
        ticks = [t for t in ticks if y_lo <= t <= y_hi]
    else:
        y_hi = ticks[-1]
    span_y = y_hi - y_lo
    x_lo, x_hi = xs[0], xs[-1]

    def px(x: float) -> float:
        if x_hi == x_lo:
            return frame.left + frame.plot_width / 2
        return frame.left + frame.plot_width * (x - x_lo) / (x_hi - x_lo)

    def py(y: float) -> float:
        return frame.bottom - frame.plot_height * (y - y_lo) / span_y

    chart.y_ticks = [Tick(_r(py(t)), y_format(t)) for t in ticks]
    x_tick_values = xs if len(xs) <= 12 else [t for t in nice_ticks(x_lo, x_hi, 8) if x_lo <= t <= x_hi]
    slot = frame.plot_width / max(len(x_tick_values) - 1, 1)
    chart.x_ticks = _thin([Tick(_r(px(x)), x_format(x)) for x in x_tick_values], slot)
    by_x: dict[float, list[float | None]] = {x: [None] * len(series) for x in xs}
    for i, (name, pts) in enumerate(series):
        s = Series(name=name, index=i % PALETTE_SIZE, dashed=bool(dashed[i]) if i < len(dashed) else False)
        for x, y in sorted(pts):
            s.points.append(Point(_r(px(x)), _r(py(y)), f"{name}, {x_label or 'x'} {x_format(x)}: {y_format(y)}"))
            by_x[float(x)][i] = y
        chart.series.append(s)
    chart.rows = [(x_format(x), by_x[x]) for x in xs]
    return chart


@dataclass
class Column:
    """One stacked column: its segments bottom-up and the total."""

    label: str
    x: float
    width: float
    total: float
    segments: list[Bar] = field(default_factory=list)


@dataclass
class StackedBarChart:
    id: str
    title: str
    desc: str
    frame: Frame
    columns: list[Column] = field(default_factory=list)
    legend: list[tuple[int, str]] = field(default_factory=list)  # (colour index, name)
    x_ticks: list[Tick] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    x_label: str = ""
    y_label: str = ""
    # a table: one row per column: (label, [value per legend entry], total)
    rows: list[tuple[str, list[float], float]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not any(c.total for c in self.columns)


def stacked_bar_chart(
    columns: Sequence[tuple[str, Mapping[str, float]]],
    *,
    id: str,
    title: str,
    desc: str = "",
    x_label: str = "",
    y_label: str = "",
    series_order: Sequence[str] | None = None,
    width: int = WIDTH,
    height: int = HEIGHT,
    value_format=format_number,
) -> StackedBarChart:
    """Columns of stacked segments: ``columns`` = ``[(label, {series name: value}), ...]``.
    Series are stacked (and coloured) in ``series_order``, default: by total, largest first, then
    by name. Each segment's tooltip reads ``"<label> · <series>: <value>"``."""
    frame = _frame(width, height)
    totals: dict[str, float] = {}
    for _, values in columns:
        for name, v in values.items():
            totals[name] = totals.get(name, 0.0) + float(v)
    order = list(series_order) if series_order is not None else sorted(totals, key=lambda n: (-totals[n], n))
    chart = StackedBarChart(
        id=id,
        title=title,
        desc=desc,
        frame=frame,
        x_label=x_label,
        y_label=y_label,
        legend=[(i % PALETTE_SIZE, name) for i, name in enumerate(order)],
    )
    chart.rows = [
        (label, [values.get(n, 0) for n in order], sum(values.get(n, 0) for n in order)) for label, values in columns
    ]
    if not columns:
        return chart
    chart.y_ticks, top = _y_axis(
        frame,
        max((row[2] for row in chart.rows), default=0.0) or 1.0,
        value_format,
        counts=_all_whole(v for _, values in columns for v in values.values()),
    )
    slot = frame.plot_width / len(columns)
    gap = min(4.0, slot * 0.15)
    labels = []
    for ci, (label, values) in enumerate(columns):
        x = frame.left + ci * slot
        column = Column(label=label, x=_r(x + gap / 2), width=_r(max(slot - gap, 1.0)), total=chart.rows[ci][2])
        base = float(frame.bottom)
        for si, name in enumerate(order):
            v = float(values.get(name, 0) or 0)
            if v <= 0:
                continue
            h = frame.plot_height * v / top
            base -= h
            column.segments.append(
                Bar(
                    x=column.x,
                    y=_r(base),
                    width=column.width,
                    height=_r(h),
                    value=v,
                    label=name,
                    title=f"{label} · {name}: {value_format(v)}",
                    series=si % PALETTE_SIZE,
                )
            )
        chart.columns.append(column)
        labels.append(Tick(_r(x + slot / 2), label))
    chart.x_ticks = _thin(labels, slot)
    return chart
