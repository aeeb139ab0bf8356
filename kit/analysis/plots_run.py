"""Figures of the runs, modelled on the reference study's traces, drawn as small multiples.

A report of many bundles draws each run's timelines and chassis heatmaps as one row of a
figure holding up to :data:`ROWS_PER_FIGURE` runs (:class:`RunRow`), not as figures of its
own: a figure's axes, ticks, titles and legend cost far more to build and render than the
lines in them, and 300 per-run figures made a 100-bundle report take a minute. A row is a
band of one axes per quantity (:class:`_Bands`), with y tick labels of its own. Rows share
the time axis (seconds from each run's first measured step), the report's y and colour ranges
(:class:`~kit.analysis.run_view.Scales`) and one legend (devices coloured by chassis place, the
same place in the same colour in every row); each row names its run, its sample period and,
when the run did not end ok, its status and error. A figure leaves out runs it has nothing to
draw of (the report says why in their sections), and is None when no run has anything; never
an empty or zero-filled plot.

Devices are named by node and chassis slot in the legends, and by slot and rank in the
heatmaps (:mod:`kit.metrics.labels`).
"""

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from kit.analysis.plots_common import (
    STATUS_COLOR,
    TITLE_PT,
    category_colors,
    colors,
    label_width,
    legend_width,
    legends_width,
    mark_steps,
    place_axes,
    set_time_axis,
    share_bars,
    status_line,
    step_handles,
    title,
    title_height,
    warmup_factor,
    wrapped,
)
from kit.analysis.run_view import DeviceSeries, RunView, Scales, TimeAxis
from kit.bundle.telemetry_fields import THROTTLE_BITS
from kit.metrics.labels import chassis_assumed, rank_device

LEGEND_MAX = 16
"""Devices of a run drawn one line each; more are drawn as their mean and min..max."""
ROWS_PER_FIGURE = 8
"""Runs per figure: enough that a 100-bundle report draws a few dozen figures, few enough
that a row stays readable."""
ROW_PT = 7.5
"""Font size of a row's title."""


@dataclass(frozen=True)
class RunRow:
    """One run of a figure of several: its number in the report, its name and its data."""

    n: int
    name: str
    view: RunView


def chunks(rows: list[RunRow], size: int = ROWS_PER_FIGURE) -> list[list[RunRow]]:
    """``rows`` in report order, ``size`` to a figure."""
    return [rows[i:i + size] for i in range(0, len(rows), size)]


def held(found: list[DeviceSeries]) -> tuple[np.ndarray, np.ndarray]:
    """All devices' readings on the union of their sample times, each device holding its last
    reading until its next one (NaN before its first): (times, values[device, time])."""
    times = np.unique(np.concatenate([s.t for s in found]))
    values = np.full((len(found), len(times)), np.nan)
    for row, s in enumerate(found):
        idx = np.searchsorted(s.t, times, side="right") - 1
        values[row, idx >= 0] = s.value[idx[idx >= 0]]
    return times, values


def _place(view: RunView, s: DeviceSeries) -> str:
    """A device's node and chassis slot (its legend entry): the same in every run."""
    if s.device < 0:
        return f"n{s.node} host CPU"
    role = view.role(s.node, s.device)
    return role.place if role else f"n{s.node} dev{s.device}"


def _palette(rows: list[RunRow], kinds: tuple[str, ...]) -> dict[str, Any]:
    """One colour per device place over every row, in node and device order."""
    found = {(s.node, s.device, _place(r.view, s)) for r in rows for kind in kinds
             for s in getattr(r.view, kind) if len(getattr(r.view, kind)) <= LEGEND_MAX}
    places = list(dict.fromkeys(place for *_, place in sorted(found)))
    return dict(zip(places, colors(len(places)), strict=True))


def run_axis(view: RunView) -> TimeAxis:
    """The run's time axis with 0 at its first measured step (its first step, else its first
    sample, when none was measured), so the runs of a figure line up."""
    axis = view.axis
    assert axis is not None
    shift = axis.measured[0] if axis.measured else 0.0
    return replace(axis, t0=axis.t0 + shift, lo=axis.lo - shift, hi=axis.hi - shift,
                   measured=(0.0, axis.measured[1] - shift) if axis.measured else None)


def shifted(s: DeviceSeries, view: RunView) -> DeviceSeries:
    """``s`` on :func:`run_axis`'s time."""
    axis = view.axis
    assert axis is not None
    return s._replace(t=s.t - (axis.measured[0] if axis.measured else 0.0))


def _shared_axis(axes: list[TimeAxis]) -> TimeAxis:
    """One time range holding every row's axis; warmup compressed as one run's would be."""
    ends = [a.measured[1] for a in axes if a.measured]
    return replace(axes[0], lo=min(a.lo for a in axes), hi=max(a.hi for a in axes),
                   measured=(0.0, max(ends)) if ends else None)


def _time_label(axis: TimeAxis) -> str:
    label = ("time from the run's first measured step (s; its first step, else first sample, "
             "when none was measured)")
    k = warmup_factor(axis)
    return label if k is None else f"{label}; left of the dotted line compressed {1 / k:.0f}x"


class _Legend:
    """The one legend of a figure: each entry once, in the order first drawn."""

    def __init__(self) -> None:
        self.entries: dict[str, Any] = {}

    def add(self, handles: list[Any], names: list[str]) -> None:
        for handle, name in zip(handles, names, strict=True):
            self.entries.setdefault(name, handle)

    def width(self) -> float:
        """Inches it takes right of the axes."""
        return legend_width(list(self.entries)) + 0.15

    def draw(self, fig: Figure, right_in: float, top_in: float) -> None:
        """Right of the axes, from their top (margins in inches)."""
        w, h = fig.get_size_inches()
        fig.legend(list(self.entries.values()), list(self.entries), loc="upper left",
                   bbox_to_anchor=(1 - right_in / w + 0.1 / w, 1 - top_in / h), fontsize=7,
                   frameon=False, borderaxespad=0)


@dataclass(frozen=True)
class _Bands:
    """Runs stacked in one axes as panels of their own: run ``i`` spans data y ``bases[i]``
    to ``bases[i] + heights[i]``, with ``gap`` above it for its title.

    One axes per quantity instead of one per run: building and drawing an axes (its axis
    objects, ticks, spines) cost more than everything drawn in it.
    """

    bases: list[float]
    heights: list[float]
    gap: float

    @classmethod
    def of(cls, heights: list[float], gap: float) -> "_Bands":
        """Top to bottom: the first run at the top."""
        bases, y = [], 0.0
        for h in reversed(heights):
            bases.append(y)
            y += h + gap
        return cls(bases[::-1], heights, gap)

    @property
    def top(self) -> float:
        return self.bases[0] + self.heights[0] + self.gap

    def at(self, i: int, lo: float, hi: float, values: np.ndarray) -> np.ndarray:
        """``values`` (from ``lo`` to ``hi``) at their height in run ``i``'s band."""
        return self.bases[i] + self.heights[i] * (np.asarray(values, float) - lo) / (hi - lo)

    def frame(self, ax: Any) -> None:
        """White between the bands (over grid lines and step shading), a frame around each,
        and the y range from the lowest band to the top title."""
        from matplotlib.collections import LineCollection, PolyCollection

        x0, x1 = -1e9, 1e9
        gaps = [[(x0, b + h), (x1, b + h), (x1, b + h + self.gap), (x0, b + h + self.gap)]
                for b, h in zip(self.bases, self.heights, strict=True)]
        ax.add_collection(PolyCollection(gaps, facecolors="white", lw=0, zorder=2.5),
                          autolim=False)
        frames = [[(0, b), (1, b), (1, b + h), (0, b + h), (0, b)]
                  for b, h in zip(self.bases, self.heights, strict=True)]
        ax.add_collection(LineCollection(frames, colors="black", lw=0.8, zorder=2.6,
                                         transform=ax.get_yaxis_transform()), autolim=False)
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.set_ylim(0, self.top)

    def title(self, ax: Any, i: int, text: str, right: bool = False, **kw: Any) -> None:
        """A line above run ``i``'s band, at the left or right."""
        ax.text(1.0 if right else 0.0, self.bases[i] + self.heights[i] + 0.12 * self.gap,
                text, transform=ax.get_yaxis_transform(), ha="right" if right else "left",
                va="bottom", zorder=3, **kw)


def _ticks(ax: Any, ticks: list[tuple[float, str]], fontsize: float = 6.5,
           grid: bool = True) -> None:
    """Y ticks at data heights, labelled (each band has its own scale), with grid lines.

    Drawn as one collection of marks and plain texts: matplotlib's ticks (each two marks, two
    labels and a grid line, kept in step with the axis) for the bands' dozens of ticks took
    half of a figure's time.
    """
    from matplotlib.collections import LineCollection

    ax.set_yticks([])
    where = ax.get_yaxis_transform()
    ys = [y for y, _ in ticks]
    ax.add_collection(LineCollection([[(-0.006, y), (0, y)] for y in ys], colors="black",
                                     lw=0.8, transform=where, clip_on=False), autolim=False)
    if grid:
        ax.add_collection(LineCollection([[(0, y), (1, y)] for y in ys], colors="#b0b0b0",
                                         alpha=0.3, lw=0.5, zorder=0.5, transform=where),
                          autolim=False)
    for y, label in ticks:
        ax.text(-0.01, y, label, transform=where, ha="right", va="center", fontsize=fontsize)


def _scale_ticks(bands: _Bands, i: int, lo: float, hi: float) -> list[tuple[float, str]]:
    """At most four round values of ``lo..hi`` in run ``i``'s band."""
    from matplotlib.ticker import MaxNLocator

    values = [v for v in MaxNLocator(4).tick_values(lo, hi) if lo <= v <= hi]
    return list(zip(bands.at(i, lo, hi, values), (f"{v:g}" for v in values), strict=True))


def _row_title(row: RunRow, width_in: float) -> str:
    """The run's number, name and, when it did not end ok, its status and error."""
    status = status_line(row.view)
    return "\n".join(wrapped([f"{row.n}. {row.name}" + (f" · {status}" if status else "")],
                             width_in, ROW_PT))


def _lines(ax: Any, bands: _Bands, i: int, span: tuple[float, float], view: RunView,
           found: list[DeviceSeries], palette: dict[str, Any], legend: _Legend) -> None:
    """Run ``i``'s devices in its band (``span``: the band's value range), one line each in
    its place's colour, or with more than :data:`LEGEND_MAX` devices their mean and a
    min..max band; samples outside the run's own time axis are left out."""
    axis = run_axis(view)
    found = [shifted(s, view) for s in found]
    found = [s._replace(t=s.t[keep], value=s.value[keep]) for s in found
             if (keep := (s.t >= axis.lo) & (s.t <= axis.hi)).any()]
    if not found:
        return
    if len(found) > LEGEND_MAX:
        times, values = held(found)
        with np.errstate(all="ignore"):
            lo, mean, hi = (np.nanmin(values, 0), np.nanmean(values, 0), np.nanmax(values, 0))
        band = ax.fill_between(times, bands.at(i, *span, lo), bands.at(i, *span, hi),
                               step="post", color="#4c78a8", alpha=0.35, lw=0)
        (line,) = ax.plot(times, bands.at(i, *span, mean), lw=0.9, color="#1f3b63",
                          drawstyle="steps-post")
        legend.add([line, band], ["mean over devices (more than 16)", "min..max over devices"])
        return
    for s in found:
        place = _place(view, s)
        (line,) = ax.plot(s.t, bands.at(i, *span, s.value), lw=0.8, color=palette[place],
                          drawstyle="steps-post")
        legend.add([line], [place])


def _limits(ax: Any, bands: _Bands, i: int, span: tuple[float, float], view: RunView,
            values: list[float], what: str, unit: str, color: str, legend: _Legend) -> None:
    """Dashed lines at ``values`` (power limit, maximum clock) over the run's time axis."""
    axis = run_axis(view)
    for value in values:
        line = ax.hlines(bands.at(i, *span, [value]), axis.lo, axis.hi, color=color,
                         linestyles="--", lw=0.9)
        legend.add([line], [f"{what} {value:.0f} {unit}"])


def _note(ax: Any, bands: _Bands, i: int, text: str) -> None:
    ax.text(0.5, bands.bases[i] + bands.heights[i] / 2, text, ha="center", va="center",
            transform=ax.get_yaxis_transform(), fontsize=7.5, color="0.3")


def _band_in(runs: int) -> float:
    """Inches of one run's timeline band: less the more runs share the figure."""
    return 2.2 if runs == 1 else 1.6 if runs <= 3 else 1.25


@dataclass(frozen=True)
class _Margins:
    """Inches around and between a timeline figure's axes, but for the legend's width."""

    left: float
    top: float
    bottom: float
    gap: float
    right: float

    def place(self, fig: Figure, legend: _Legend) -> None:
        place_axes(fig, self.left, legend.width() + self.right, self.top, self.bottom,
                   gap=self.gap)


def _timeline_figure(rows: list[RunRow], heading: str, columns: list[str], left_in: float,
                     gap_in: float, extra_right_in: float,
                     ) -> tuple[Figure, list[Any], _Bands, _Margins]:
    """A figure of one axes per column (quantity), sharing the time axis, each with a band
    per run: its step shading, its title (run, status) and sample period; then the caller
    draws the data and :func:`_finish` adds the legend."""
    width = 11.0
    titles = [_row_title(r, 6.0) for r in rows]
    lines = max(t.count("\n") + 1 for t in titles)
    title_in = 0.12 + lines * ROW_PT * 1.35 / 72
    band_in = _band_in(len(rows))
    bands = _Bands.of([1.0] * len(rows), title_in / band_in)
    heading_lines = wrapped([heading], width - 0.4)
    top, bottom = title_height(len(heading_lines)) + 0.25, 0.7
    fig = Figure(figsize=(width, top + bottom + len(rows) * (band_in + title_in)))
    axes = list(fig.subplots(1, len(columns), sharex=True, squeeze=False)[0])
    fig.suptitle("\n".join(heading_lines), fontsize=TITLE_PT)
    margins = _Margins(left_in, top, bottom, gap_in, extra_right_in)
    margins.place(fig, _Legend())
    run_axes = [run_axis(r.view) for r in rows]
    shared = _shared_axis(run_axes)
    set_time_axis(axes[0], shared)
    for ax, name in zip(axes, columns, strict=True):
        ax.set_title(name, fontsize=8.5, fontweight="bold", y=1.0, pad=4)
        for i, axis in enumerate(run_axes):
            mark_steps(ax, axis, (bands.bases[i], bands.bases[i] + 1))
        ax.grid(alpha=0.3, lw=0.5)
        ax.tick_params(labelsize=7)
        bands.frame(ax)
        if ax is not axes[0] and warmup_factor(shared) is not None:
            ax.axvline(0.0, color="0.3", lw=0.8, ls=":")
    for i, (row, text) in enumerate(zip(rows, titles, strict=True)):
        bands.title(axes[0], i, text, fontsize=ROW_PT,
                    color=STATUS_COLOR if status_line(row.view) else "black")
        bands.title(axes[-1], i, row.view.period_text(), right=True, fontsize=6.5, color="0.35")
    axes[0].set_xlabel(_time_label(shared), fontsize=8, loc="left")
    return fig, axes, bands, margins


def _finish(fig: Figure, legend: _Legend, margins: _Margins) -> None:
    """The figure's one legend right of its axes, which make room for it."""
    margins.place(fig, legend)
    legend.draw(fig, legend.width(), margins.top)


def power_rows(rows: list[RunRow]) -> list[RunRow]:
    """The runs :func:`power_timelines` draws: those with power or temperature samples."""
    return [r for r in rows if r.view.axis is not None and (r.view.power or r.view.temp)]


def power_timelines(rows: list[RunRow], scales: Scales) -> Figure | None:
    """Power (with the power limit) and GPU temperature of every device over time, a band
    per run of :func:`power_rows`."""
    rows = power_rows(rows)
    if not rows:
        return None
    kinds = sorted({r.view.power_kind for r in rows if r.view.power})
    palette = _palette(rows, ("power", "temp"))
    legend = _Legend()
    legend.add(*step_handles(run_axis(rows[0].view)))
    power = f"{kinds[0]} power (W)" if len(kinds) == 1 else "power (W; kind in each title)"
    heading = "Power and temperature per device" + (
        f", runs {rows[0].n}-{rows[-1].n}" if len(rows) > 1 else "")
    fig, (p_ax, t_ax), bands, margins = _timeline_figure(
        rows, heading, [power, "GPU temperature (°C)"], 0.55, 0.55, 0.0)
    p_ticks: list[tuple[float, str]] = []
    t_ticks: list[tuple[float, str]] = []
    for i, row in enumerate(rows):
        view = row.view
        top = scales.power_top_w.get(view.power_kind)
        if view.power and top:
            _lines(p_ax, bands, i, (0, top), view, view.power, palette, legend)
            _limits(p_ax, bands, i, (0, top), view, view.power_limits_w, "power limit", "W",
                    STATUS_COLOR, legend)
            p_ticks += _scale_ticks(bands, i, 0, top)
            if len(kinds) > 1:
                bands.title(p_ax, i, view.power_kind, right=True, fontsize=6.5, color="0.35")
        else:
            _note(p_ax, bands, i, "power not measured")
        if view.temp and scales.temp_c:
            _lines(t_ax, bands, i, scales.temp_c, view, view.temp, palette, legend)
            t_ticks += _scale_ticks(bands, i, *scales.temp_c)
        else:
            _note(t_ax, bands, i, "temperature not measured")
    _ticks(p_ax, p_ticks)
    _ticks(t_ax, t_ticks)
    _finish(fig, legend, margins)
    return fig


def throttle_steps(throttle: list[DeviceSeries], bit: int) -> tuple[np.ndarray, np.ndarray]:
    """Share of devices with ``bit`` set, as a step function over all sample times.

    Each device holds its last reading until its next one; a device counts from its first
    reading on. Returns (times, share) with share in 0..1.
    """
    times, values = held(throttle)
    return times, _share_on(values, bit)


def _share_on(values: np.ndarray, bit: int) -> np.ndarray:
    """Per time, the share of the devices with a reading (:func:`held`) that have ``bit``."""
    seen = ~np.isnan(values)
    on = (np.nan_to_num(values).astype(np.int64) & bit) != 0
    count = seen.sum(0)
    return np.where(count > 0, (on & seen).sum(0) / np.maximum(count, 1), 0.0)


def _step_polygon(times: np.ndarray, height: np.ndarray, base: float) -> np.ndarray:
    """The outline of a step function (each value held until the next time) over ``base``."""
    x = np.repeat(times, 2)[1:]
    y = np.repeat(height, 2)[:-1]
    return np.column_stack([np.r_[x, x[-1], x[0]], np.r_[y, base, base]])


def _throttle_band(ax: Any, bands: _Bands, i: int, view: RunView,
                   polygons: list[np.ndarray]) -> list[tuple[float, str]]:
    """Run ``i``'s throttle reasons, a row each: a band as high as the share of devices with
    it active (``polygons``, drawn by the caller as one collection), and at the right the
    share of the measured steps' samples (of all samples, said, when none was measured);
    returns the rows' ticks."""
    names = list(THROTTLE_BITS)
    axis = run_axis(view)
    throttle = [shifted(s, view) for s in view.throttle]
    times, values = held(throttle)
    keep = (times >= axis.lo) & (times <= axis.hi)
    focus = axis.measured
    ticks = []
    for row, bit in enumerate(THROTTLE_BITS.values()):
        y = bands.at(i, 0, len(names), [row + 0.1])[0]
        tall = bands.heights[i] * 0.8 / len(names)
        if keep.any():
            share = _share_on(values[:, keep], bit)
            polygons.append(_step_polygon(times[keep], y + tall * share, y))
        pooled = np.concatenate([((s.value.astype(np.int64) & bit) != 0)[
            (s.t >= focus[0]) & (s.t <= focus[1])] if focus else
            ((s.value.astype(np.int64) & bit) != 0) for s in throttle])
        if len(pooled):
            ax.text(1.008, y + tall / 2, f"{pooled.mean():.0%}", va="center", fontsize=6.5,
                    transform=ax.get_yaxis_transform())
        ticks.append((y + tall / 2, names[row]))
    if not focus:
        ax.text(1.008, bands.bases[i] + bands.heights[i], "of all\nsamples", va="bottom",
                fontsize=6.5, transform=ax.get_yaxis_transform())
    return ticks


def clock_rows(rows: list[RunRow]) -> list[RunRow]:
    """The runs :func:`clock_throttle_timelines` draws: those with SM clock or throttle
    samples."""
    return [r for r in rows if r.view.axis is not None and (r.view.clock or r.view.throttle)]


def clock_throttle_timelines(rows: list[RunRow], scales: Scales) -> Figure | None:
    """SM clock of every device over time and when each throttle reason was active, a band
    per run of :func:`clock_rows`."""
    from matplotlib.collections import PolyCollection

    rows = clock_rows(rows)
    if not rows:
        return None
    palette = _palette(rows, ("clock",))
    legend = _Legend()
    legend.add(*step_handles(run_axis(rows[0].view)))
    legend.add(*([PolyCollection([], facecolors="#c0392b")], ["throttle reason active"]))
    heading = ("SM clock and throttle reasons per device"
               + (f", runs {rows[0].n}-{rows[-1].n}" if len(rows) > 1 else "")
               + "; band height: share of devices with the reason active; at the right: "
                 "share of the measured steps' samples")
    fig, (c_ax, t_ax), bands, margins = _timeline_figure(
        rows, heading, ["SM clock (MHz)", "throttle reasons"], 0.55, 1.45, 0.35)
    c_ticks: list[tuple[float, str]] = []
    t_ticks: list[tuple[float, str]] = []
    polygons: list[np.ndarray] = []
    for i, row in enumerate(rows):
        view = row.view
        if view.clock and scales.clock_mhz:
            _lines(c_ax, bands, i, scales.clock_mhz, view, view.clock, palette, legend)
            _limits(c_ax, bands, i, scales.clock_mhz, view, view.clock_max_mhz, "max SM clock",
                    "MHz", "black", legend)
            c_ticks += _scale_ticks(bands, i, *scales.clock_mhz)
        else:
            _note(c_ax, bands, i, "SM clock not measured")
        if view.throttle:
            t_ticks += _throttle_band(t_ax, bands, i, view, polygons)
        else:
            _note(t_ax, bands, i, "throttle reasons not measured")
    t_ax.add_collection(PolyCollection(polygons, facecolors="#c0392b", lw=0, zorder=2),
                        autolim=False)
    _ticks(c_ax, c_ticks)
    _ticks(t_ax, t_ticks)
    _finish(fig, legend, margins)
    return fig


def _present_grid(chassis: list[dict[str, Any]], devices: set[int]) -> tuple[
        list[dict[str, Any]], list[int], list[int]]:
    """The chassis positions of ``devices``, and the rows and columns they occupy."""
    present = [p for p in chassis if p["device"] in devices]
    return present, sorted({p["row"] for p in present}), sorted({p["col"] for p in present})


def _luminance(rgba: tuple[float, ...]) -> float:
    """Relative luminance of a colour (ITU-R BT.709 weights), to pick black or white text."""
    return 0.2126 * rgba[0] + 0.7152 * rgba[1] + 0.0722 * rgba[2]


@dataclass(frozen=True)
class ChassisPanel:
    """One node of one run at its chassis positions: a band of the heatmap figure."""

    row: RunRow
    node: int
    present: list[dict[str, Any]]
    rows: list[int]
    cols: list[int]


def chassis_panels(rows: list[RunRow]) -> list[ChassisPanel]:
    """Per run and node, the chassis positions holding the run's GPUs (runs without any left
    out)."""
    out = []
    for r in rows:
        chassis = r.view.bundle.manifest.platform.get("chassis") or []
        present, crows, ccols = _present_grid(chassis, {d for _, d in r.view.stats})
        if present:
            out += [ChassisPanel(r, node, present, crows, ccols)
                    for node in sorted({n for n, _ in r.view.stats})]
    return out


_QUANTITIES = (("temp_mean", "mean GPU temperature", "°C", "inferno"),
               ("power_mean", "mean power", "W", "viridis"))


def _heatmap(ax: Any, bands: _Bands, i: int, panel: ChassisPanel, key: str, unit: str,
             cmap: Any, norm: Any) -> list[tuple[float, str]]:
    """One node's mean of ``key`` per GPU at its chassis position in band ``i``, each cell
    with its slot (``(assumed)`` when the profile says so), rank and value, each column
    named under it; a value outside the report's colour range (a failed run's idle GPUs) is
    drawn in the range's end colour and said. Returns the band's row ticks."""
    view = panel.row.view
    assumed = chassis_assumed(view.bundle.manifest.platform)
    base, rows = bands.bases[i], len(panel.rows)
    grid = np.full((rows, len(panel.cols)), np.nan)
    for p in panel.present:
        stats = view.stats.get((panel.node, p["device"]))
        value = getattr(stats, key) if stats else None
        y, x = panel.rows.index(p["row"]), panel.cols.index(p["col"])
        if value is not None:
            grid[y, x] = value
        role = view.role(panel.node, p["device"])
        slot = f"{p['slot']} (assumed)" if assumed else p["slot"]
        beyond = value is not None and not norm.vmin <= value <= norm.vmax
        text = (f"{slot}\n{role.role if role else 'no samples'}\n"
                + (f"{value:.0f} {unit}" if value is not None else "n/a")
                + (" (off scale)" if beyond else ""))
        dark = value is not None and _luminance(cmap(norm(value))) < 0.5
        ax.text(x, base + rows - 0.5 - y, text, ha="center", va="center", fontsize=6.5,
                color="white" if dark else "black", zorder=3)
    ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto",
              interpolation="nearest", extent=(-0.5, len(panel.cols) - 0.5, base, base + rows))
    for x, col in enumerate(panel.cols):
        ax.text(x, base - 0.04, f"col {col}", ha="center", va="top", fontsize=6.5, zorder=3)
    return [(base + rows - 0.5 - y, f"row {r}" + (" (front)" if r == 0 else ""))
            for y, r in enumerate(panel.rows)]


def chassis_heatmaps(rows: list[RunRow], scales: Scales) -> Figure | None:
    """Mean temperature and power of each GPU over its run's focus, at its chassis position:
    a band per run and node, an axes per quantity, one colour scale per quantity (the
    report's, set by the runs that ended ok) with one colour bar."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    panels = chassis_panels(rows)
    if not panels:
        return None
    assumed = any(chassis_assumed(p.row.view.bundle.manifest.platform) for p in panels)
    runs = sorted({p.row.n for p in panels})
    heading = ("Per GPU by chassis position (row 0: air inlet), over each run's measured "
               "steps unless its title says otherwise"
               + (f"; runs {runs[0]}-{runs[-1]}" if len(runs) > 1 else "")
               + ("; positions ASSUMED by the platform profile where slots say (assumed)"
                  if assumed else ""))
    heading_lines = wrapped([heading], 10.6)
    titles = [_panel_title(p) for p in panels]
    lines = max(t.count("\n") + 1 for t in titles)
    heights = [float(len(p.rows)) for p in panels]
    row_in = max(0.55, 1.8 / sum(heights))  # a colour bar of at least 1.8 inches
    gap_in = 0.3 + lines * ROW_PT * 1.35 / 72  # the columns' names, then the next title
    bands = _Bands.of(heights, gap_in / row_in)
    top, bottom = title_height(len(heading_lines)) + 0.3, 0.2
    fig = Figure(figsize=(11, top + bottom + row_in * bands.top))
    axes = fig.subplots(1, 2, squeeze=False)[0]
    fig.suptitle("\n".join(heading_lines), fontsize=TITLE_PT)
    place_axes(fig, 0.95, 0.75, top, bottom, gap=1.4)
    spans = (scales.temp_mean_c, scales.power_mean_w)
    width = max(len(p.cols) for p in panels)
    ticks: list[tuple[float, str]] = []
    for ax, (key, name, unit, cmap_name), span in zip(axes, _QUANTITIES, spans, strict=True):
        cmap, norm = colormaps[cmap_name], Normalize(*span) if span else Normalize(0, 1)
        ax.set_facecolor("0.85")
        for i, panel in enumerate(panels):
            band_ticks = _heatmap(ax, bands, i, panel, key, unit, cmap, norm)
            ticks += band_ticks if ax is axes[0] else []
        bands.frame(ax)
        ax.set_xlim(-0.5, width - 0.5)
        ax.set_xticks([])
        ax.set_title(name, fontsize=8.5, fontweight="bold", y=1.0, pad=4)
        bar = fig.colorbar(ScalarMappable(norm, cmap), ax=ax, fraction=0.05, pad=0.03,
                           aspect=max(20, 10 * len(panels)))
        bar.set_label(f"{name} ({unit})", fontsize=8)
        bar.ax.tick_params(labelsize=7)
    _ticks(axes[0], ticks, grid=False)
    axes[1].set_yticks([])
    for i, (panel, text) in enumerate(zip(panels, titles, strict=True)):
        ok = panel.row.view.bundle.manifest.status == "ok"
        bands.title(axes[0], i, text, fontsize=ROW_PT, color="black" if ok else STATUS_COLOR)
    return fig


def _panel_title(panel: ChassisPanel) -> str:
    """Run, node, status when not ok and what the means cover when not the measured steps,
    wrapped to the width of a heatmap."""
    view = panel.row.view
    status = view.bundle.manifest.status
    mark = f" · {status.upper()}" if status != "ok" and status not in panel.row.name else ""
    scope = "" if view.scope == "measured steps" else f" · over the {view.scope}"
    return "\n".join(wrapped([f"{panel.row.n}. {panel.row.name} · node {panel.node}{mark}"
                              f"{scope}"], 3.4, ROW_PT))


def kernel_breakdown(times: dict[str, dict[str, float]], view: RunView) -> Figure | None:
    """Share of kernel time per category, one stacked bar per profiled trace (None if none)."""
    from kit.metrics.kernels import CATEGORIES, OTHER

    if not times:
        return None
    cats = [c for c, _ in CATEGORIES] + [OTHER]
    palette = category_colors()
    ranks = {r.rank: r for r in view.bundle.manifest.ranks}
    fig = Figure(figsize=(11, 1.9 + 0.5 * len(times)))
    ax = fig.add_subplot()
    manifest = view.bundle.manifest
    rows = []
    for trace, totals in times.items():
        total = sum(totals.values())
        digits = "".join(ch for ch in trace if ch.isdigit())
        rank = ranks.get(int(digits)) if digits else None
        role = (view.role(rank.node, rank_device(manifest, rank.node, rank.local_rank))
                if rank else None)
        rows.append((f"{trace}" + (f" ({role.role})" if role else "")
                     + f"\n{total * 1e3:.3g} ms", {c: v / total for c, v in totals.items()}))
    share_bars(ax, rows, cats, palette, "share of kernel time")
    lines = title(fig, "Kernel time by category, per profiled trace", view)
    place_axes(fig, label_width([name for name, _ in rows], 7.5) + 0.3,
               legends_width(fig) + 0.15, title_height(lines), 0.5)
    return fig
