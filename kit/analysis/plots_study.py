"""The reference study's cross-run figures: metrics against a swept parameter, and telemetry
over time compared across layouts.

* :func:`sweep_lines`: throughput, MFU, mean and peak power, energy per token, excursion time
  and exposed communication against the parameter the configurations sweep (micro-batch size,
  or a parallel degree), when they sweep one: a line joins configurations alike in all else,
  and one that matches no other is a point (:mod:`kit.analysis.sweep_series`).
* :func:`link_timelines`: NVLink/xGMI and PCIe bytes per second over time, all GPUs of a run
  together, one line per layout (the counters do not tell tensor, pipeline and data traffic
  apart; the exposed-communication figure splits the profiled time by collective).
* :func:`position_timelines`: temperature and SM clock over time at each chassis position,
  one line per layout.
* :func:`throttle_timelines`: per active throttle reason, the share of a run's GPUs it held
  over time, one line per layout.

Time is seconds from each run's first measured step (its first step when none was measured),
so layouts line up at the start of their measured phase. Each layout is drawn from its
configuration's first run; a run that did not end ok is drawn dashed.
"""

from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from kit.analysis.compare import Comparison, Group, figure_order
from kit.analysis.plots_common import TITLE_PT, colors, legend_outside, wrapped
from kit.analysis.plots_cross import comm_shares
from kit.analysis.plots_run import held, throttle_steps
from kit.analysis.run_view import DeviceSeries, RunView, series
from kit.analysis.sweep_series import find_sweep, parameter_name, what_moves
from kit.bundle.telemetry_fields import THROTTLE_BITS
from kit.metrics.labels import chassis_assumed

_LEGEND_MAX = 24
"""Layouts named in a legend; beyond that the colours stand alone."""


_PANELS: tuple[tuple[str, str], ...] = (
    ("tokens_per_s", "throughput (tokens/s)"),
    ("mfu", "MFU (%)"),
    ("power_w_mean", "mean power per GPU (W)"),
    ("power_w_peak", "peak power per GPU (W)"),
    ("energy_j_per_token", "energy per token (J)"),
    ("power.excursion_s", "excursion time (s)"),
    ("exposed", "exposed communication\n(share of profiled step)"),
)


def _exposed(g: Group) -> float | None:
    shares = comm_shares(g.bundles[0])
    return sum(shares[0].values()) if shares else None


def _panel_value(g: Group, key: str) -> float | None:
    if key == "exposed":
        return _exposed(g)
    value = g.values[key].median if key in g.values else None
    return value * 100 if key == "mfu" and value is not None else value


_LINE = {"marker": "o", "ms": 4, "lw": 1.2}
_POINT = {"marker": "D", "ms": 5, "ls": "none"}
"""How a line and a lone configuration are drawn: a point is never joined to anything."""


def sweep_lines(c: Comparison) -> Figure | None:
    """Every panel of :data:`_PANELS` against the swept parameter, from zero: a line joins
    configurations that differ in it alone, a configuration no other matches is a point
    (:mod:`kit.analysis.sweep_series`); None when the configurations sweep nothing."""
    sweep = find_sweep(c)
    if sweep is None:
        return None
    panels = [(k, label) for k, label in _PANELS
              if any(_panel_value(g, k) is not None for e in sweep.entries for _, g in e.points)]
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig = Figure(figsize=(3.3 * cols + 2.8, 1.1 + 2.6 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    palette = colors(len(sweep.entries))
    values = sorted({v for e in sweep.entries for v, _ in e.points})
    for ax, (key, label) in zip(axes, panels, strict=False):
        top = 0.0
        for entry, color in zip(sweep.entries, palette, strict=True):
            xy = [(v, y) for v, g in entry.points if (y := _panel_value(g, key)) is not None]
            if xy:
                ax.plot(*zip(*xy, strict=True), color=color, label=entry.name,
                        **(_LINE if entry.is_line else _POINT))
                top = max([top, *(y for _, y in xy)])
        ax.set_ylim(0, top * 1.08 or 1.0)  # every quantity is >= 0: from 0, nothing inflated
        ax.set_title(label, fontsize=8.5)
        if min(values) > 0:
            ax.set_xscale("log", base=2)
        ax.set_xticks(values, [f"{v:g}" for v in values], fontsize=7.5)
        ax.minorticks_off()
        ax.tick_params(axis="y", labelsize=7.5)
        ax.grid(alpha=0.3, lw=0.5)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    name = parameter_name(sweep.parameter)
    for ax in axes[:len(panels)][-cols:]:
        ax.set_xlabel(name, fontsize=8)
    if len(sweep.entries) <= _LEGEND_MAX:  # one entry each, whichever panels it has values in
        handles = [Line2D([], [], color=color, **(_LINE if e.is_line else _POINT))
                   for e, color in zip(sweep.entries, palette, strict=True)]
        fig.legend(handles, [e.name for e in sweep.entries], loc="outside right center",
                   fontsize=7, frameon=False, title="held fixed", title_fontsize=7)
    title = [f"Against {name}{what_moves(sweep.parameter)}: a line joins configurations "
             "that differ in nothing else"
             + ("; a point: one that no other matches" if sweep.alone else "")]
    title += [f"all held alike: {' '.join(sweep.shared)}"] if sweep.shared else []
    fig.suptitle("\n".join(wrapped(title, fig.get_figwidth() - 0.4)), fontsize=TITLE_PT)
    return fig


def _origin(view: RunView) -> float:
    """Seconds (on the view's axis) where the measured phase starts, else 0 (first step)."""
    return view.axis.measured[0] if view.axis and view.axis.measured else 0.0


def _shown(view: RunView, t: np.ndarray, value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The samples inside the view's time axis (its steps and a little around them), with time
    from the measured phase's start."""
    assert view.axis is not None
    keep = (t >= view.axis.lo) & (t <= view.axis.hi)
    return t[keep] - _origin(view), value[keep]


def _summed_rate(view: RunView, fields: tuple[str, str]) -> tuple[np.ndarray, np.ndarray] | None:
    """All GPUs' bytes per second of two cumulative counters together, over time."""
    if view.axis is None:
        return None
    rates = []
    for name in fields:
        for s in series(view.bundle.telemetry, "gpu", name, view.axis.t0):
            dt = np.diff(s.t)
            keep = dt > 0
            if keep.sum() < 1:
                continue
            rate = np.diff(s.value)[keep] / dt[keep]
            rates.append(DeviceSeries(s.node, s.device, s.t[1:][keep], np.maximum(rate, 0)))
    if not rates:
        return None
    times, values = held(rates)
    return _shown(view, times, np.nansum(values, 0))


def _layouts(c: Comparison, views: dict[str, RunView]) -> list[tuple[str, RunView, Any, str]]:
    """(name, view, colour, line style) of each configuration with telemetry, in figure
    order."""
    groups = [g for g in figure_order(c) if g.label in views and views[g.label].axis]
    palette = colors(len(groups))
    return [(g.short, views[g.label], color, "-" if g.status == "ok" else "--")
            for g, color in zip(groups, palette, strict=True)]


def _legend(fig: Figure, ax: Any, layouts: list[tuple[str, RunView, Any, str]]) -> None:
    if len(layouts) <= _LEGEND_MAX:
        handles = [ax.plot([], [], color=color, ls=style)[0] for _, _, color, style in layouts]
        legend_outside(ax, handles, [name for name, *_ in layouts], title="layout")


def link_timelines(c: Comparison, views: dict[str, RunView]) -> Figure | None:
    """NVLink/xGMI and PCIe bytes per second of all GPUs over time, one line per layout."""
    layouts = _layouts(c, views)
    panels = [(fields, label) for fields, label in (
        (("link_tx_bytes", "link_rx_bytes"), "NVLink/xGMI sent + received (GB/s)"),
        (("pcie_tx_bytes", "pcie_rx_bytes"), "PCIe sent + received (GB/s)"))
        if any(_summed_rate(v, fields) is not None for _, v, _, _ in layouts)]
    if not panels:
        return None
    fig = Figure(figsize=(13, 1.2 + 2.6 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (fields, label) in zip(axes, panels, strict=True):
        for _, view, color, style in layouts:
            found = _summed_rate(view, fields)
            if found is not None:
                ax.plot(found[0], found[1] / 1e9, color=color, ls=style, lw=0.9,
                        drawstyle="steps-post")
        ax.set_ylabel(label, fontsize=8)
        ax.axvline(0, color="0.3", lw=0.8, ls=":")
        ax.grid(alpha=0.3, lw=0.5)
    _legend(fig, axes[0], layouts)
    axes[-1].set_xlabel("time from the first measured step (s); all GPUs of the run together")
    fig.suptitle("Link traffic over time per layout (the counters do not separate tensor, "
                 "pipeline and data traffic)", fontsize=9.5)
    return fig


def _positions(layouts: list[tuple[str, RunView, Any, str]]) -> list[str]:
    """Chassis slots (else device indices) of every layout's GPUs, in device order."""
    seen: dict[str, int] = {}
    for _, view, _, _ in layouts:
        for role in view.roles:
            seen.setdefault(role.slot or f"dev{role.device}", role.device)
    return sorted(seen, key=lambda k: seen[k])


def _at(view: RunView, found: list[DeviceSeries], slot: str) -> list[DeviceSeries]:
    return [s for s in found if (r := view.role(s.node, s.device)) is not None
            and (r.slot or f"dev{r.device}") == slot]


def position_timelines(c: Comparison, views: dict[str, RunView]) -> Figure | None:
    """Temperature and SM clock at each chassis position over time, one line per layout
    (node 0's GPU at that position)."""
    layouts = [lay for lay in _layouts(c, views) if lay[1].temp or lay[1].clock]
    if not layouts:
        return None
    slots = _positions(layouts)
    assumed = any(chassis_assumed(v.bundle.manifest.platform) for _, v, _, _ in layouts)
    fig = Figure(figsize=(13, 1.0 + 1.7 * len(slots)), layout="constrained")
    axes = fig.subplots(len(slots), 2, sharex=True, squeeze=False)
    for row, slot in enumerate(slots):
        for col, (attr, label) in enumerate((("temp", "temperature (°C)"),
                                             ("clock", "SM clock (MHz)"))):
            ax = axes[row, col]
            for _, view, color, style in layouts:
                for s in _at(view, getattr(view, attr), slot):
                    if s.node == 0:
                        t, value = _shown(view, s.t, s.value)
                        ax.plot(t, value, color=color, ls=style, lw=0.8, drawstyle="steps-post")
            ax.set_title(f"{slot}{' (assumed)' if assumed else ''}: {label}", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3, lw=0.5)
    _legend(fig, axes[0, 1], layouts)
    for ax in axes[-1]:
        ax.set_xlabel("time from the first measured step (s)", fontsize=8)
    fig.suptitle("Per chassis position (node 0): temperature and SM clock over time, one line "
                 "per layout" + ("; positions ASSUMED by the platform profile" if assumed
                                 else ""), fontsize=9.5)
    return fig


def throttle_timelines(c: Comparison, views: dict[str, RunView]) -> Figure | None:
    """Per throttle reason active in some run, the share of each run's GPUs it held over
    time, one line per layout; None when no run recorded throttle reasons."""
    layouts = [lay for lay in _layouts(c, views) if lay[1].throttle]
    if not layouts:
        return None
    active = [(name, bit) for name, bit in THROTTLE_BITS.items()
              if any((s.value.astype(np.int64) & bit).any() for _, v, _, _ in layouts
                     for s in v.throttle)]
    if not active:
        return None
    fig = Figure(figsize=(13, 1.0 + 1.6 * len(active)), layout="constrained")
    axes = fig.subplots(len(active), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (name, bit) in zip(axes, active, strict=True):
        for _, view, color, style in layouts:
            times, share = _shown(view, *throttle_steps(view.throttle, bit))
            ax.plot(times, share * 100, color=color, ls=style, lw=0.9, drawstyle="steps-post")
        ax.set_ylabel(f"{name}\n(% of GPUs)", fontsize=8)
        ax.set_ylim(-5, 105)
        ax.grid(alpha=0.3, lw=0.5)
    _legend(fig, axes[0], layouts)
    axes[-1].set_xlabel("time from the first measured step (s)")
    fig.suptitle("Throttle reasons over time per layout (reasons never active are left out)",
                 fontsize=9.5)
    return fig
