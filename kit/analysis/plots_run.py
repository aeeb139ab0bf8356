"""Figures of one run, modelled on the reference study's traces; each a matplotlib ``Figure``.

Each takes a :class:`~kit.analysis.run_view.RunView` and the report's shared
:class:`~kit.analysis.run_view.Scales`, so the same quantity has the same axis or colour range
in every run's figure. A function returns None when the bundle holds nothing it could draw (the
report then says why), never an empty or zero-filled plot. Every figure names the run, its
recorded sample period and, when the run did not end ok, its status and error.

Devices are named by node, chassis slot and the rank they ran (:mod:`kit.analysis.labels`).
"""

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from kit.analysis.figure_reuse import figure_and_axes
from kit.analysis.labels import chassis_assumed, rank_device
from kit.analysis.plots_common import (
    STATUS_COLOR,
    category_colors,
    colors,
    label_width,
    legend_outside,
    legends_width,
    mark_steps,
    place_axes,
    set_time_axis,
    share_bars,
    step_handles,
    time_label,
    title,
    title_height,
)
from kit.analysis.run_view import DeviceSeries, RunView, Scales
from kit.telemetry.fields import THROTTLE_BITS

LEGEND_MAX = 16
"""Devices drawn one line each, named in the legend; more are drawn as mean and min..max."""


def _name(view: RunView, s: DeviceSeries) -> str:
    if s.device < 0:
        return f"n{s.node} host CPU"
    role = view.role(s.node, s.device)
    return f"{role.place} · {role.role}" if role else f"n{s.node} dev{s.device}"


def held(found: list[DeviceSeries]) -> tuple[np.ndarray, np.ndarray]:
    """All devices' readings on the union of their sample times, each device holding its last
    reading until its next one (NaN before its first): (times, values[device, time])."""
    times = np.unique(np.concatenate([s.t for s in found]))
    values = np.full((len(found), len(times)), np.nan)
    for row, s in enumerate(found):
        idx = np.searchsorted(s.t, times, side="right") - 1
        values[row, idx >= 0] = s.value[idx[idx >= 0]]
    return times, values


def _lines(ax: Any, view: RunView, found: list[DeviceSeries]) -> tuple[list[Any], list[str]]:
    """One line per device, or with more than :data:`LEGEND_MAX` devices their mean and a
    min..max band; the handles and names for a legend."""
    if len(found) > LEGEND_MAX:
        times, values = held(found)
        with np.errstate(all="ignore"):
            lo, mean, hi = (np.nanmin(values, 0), np.nanmean(values, 0), np.nanmax(values, 0))
        band = ax.fill_between(times, lo, hi, step="post", color="#4c78a8", alpha=0.35, lw=0)
        (line,) = ax.plot(times, mean, lw=0.9, color="#1f3b63", drawstyle="steps-post")
        ax.grid(alpha=0.3, lw=0.5)
        return [line, band], [f"mean of {len(found)} devices", "min..max over devices"]
    handles, names = [], []
    for s, color in zip(found, colors(len(found)), strict=True):
        (line,) = ax.plot(s.t, s.value, lw=0.9, color=color, drawstyle="steps-post")
        handles.append(line)
        names.append(_name(view, s))
    ax.grid(alpha=0.3, lw=0.5)
    return handles, names


def _legend(ax: Any, handles: list[Any], names: list[str],
            extra: tuple[list[Any], list[str]]) -> None:
    legend_outside(ax, [*handles, *extra[0]], [*names, *extra[1]])


def power_timeline(view: RunView, scales: Scales) -> Figure | None:
    """Power (with the power limit) and GPU temperature of every device over time."""
    if view.axis is None or not (view.power or view.temp):
        return None
    panels = [p for p in ("power", "temp") if (view.power if p == "power" else view.temp)]
    fig, grid = figure_and_axes((11, 1.4 + 2.4 * len(panels)), len(panels), 1, sharex=True,
                                squeeze=False)
    axes = grid[:, 0]
    for ax, panel in zip(axes, panels, strict=True):
        mark_steps(ax, view.axis)
        found = view.power if panel == "power" else view.temp
        handles, names = _lines(ax, view, found)
        extra: tuple[list[Any], list[str]] = step_handles(view.axis)
        if panel == "power":
            ax.set_ylabel(f"{view.power_kind} power (W)")
            for limit in view.power_limits_w:
                line = ax.axhline(limit, color=STATUS_COLOR, ls="--", lw=1)
                extra = ([*extra[0], line], [*extra[1], f"power limit {limit:.0f} W"])
            if view.power_kind in scales.power_top_w:
                ax.set_ylim(0, scales.power_top_w[view.power_kind])
        else:
            ax.set_ylabel("GPU temperature (°C)")
            if scales.temp_c:
                ax.set_ylim(*scales.temp_c)
        if ax is axes[0] or [s[:2] for s in found] != [s[:2] for s in view.power]:
            _legend(ax, handles, names, extra)  # once, unless devices differ
        set_time_axis(ax, view.axis)
    axes[-1].set_xlabel(time_label(view.axis))
    lines = title(fig, "Power and temperature per device", view)
    place_axes(fig, 0.8, legends_width(fig) + 0.15, title_height(lines), 0.55, gap=0.25)
    return fig


def _present_grid(chassis: list[dict[str, Any]], devices: set[int]) -> tuple[
        list[dict[str, Any]], list[int], list[int]]:
    """The chassis positions of ``devices``, and the rows and columns they occupy."""
    present = [p for p in chassis if p["device"] in devices]
    return present, sorted({p["row"] for p in present}), sorted({p["col"] for p in present})


def _luminance(rgba: tuple[float, ...]) -> float:
    """Relative luminance of a colour (ITU-R BT.709 weights), to pick black or white text."""
    return 0.2126 * rgba[0] + 0.7152 * rgba[1] + 0.0722 * rgba[2]


def chassis_heatmaps(view: RunView, scales: Scales) -> Figure | None:
    """Mean temperature and power of each device over the focus, at its chassis position.

    Only the rows and columns of the chassis that hold devices of the run are drawn; colour
    ranges are the report's (:class:`Scales`), the same for every run.
    """
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    chassis = view.bundle.manifest.platform.get("chassis") or []
    present, rows, cols = _present_grid(chassis, {d for _, d in view.stats})
    if not present:
        return None
    nodes = sorted({n for n, _ in view.stats})
    quantities = [("temp_mean", "mean GPU temperature", "°C", "inferno", scales.temp_mean_c),
                  ("power_mean", "mean power", "W", "viridis", scales.power_mean_w)]
    fig = Figure(figsize=(max(min(1.2 + 1.7 * len(cols) * len(nodes), 16) + 1.4, 8.5),
                          1.5 + 2 * (0.5 + 0.75 * len(rows))))
    axes = fig.subplots(2, len(nodes), squeeze=False)
    assumed = chassis_assumed(view.bundle.manifest.platform)
    lines = title(fig, f"Per GPU over the {view.scope}, by chassis position (row 0: air "
                  "inlet)" + ("; positions ASSUMED by the platform profile" if assumed else ""),
                  view)
    place_axes(fig, 0.95, 0.3, title_height(lines) + 0.1, 0.35, gap=0.55)
    for r, (key, name, unit, cmap_name, span) in enumerate(quantities):
        cmap = colormaps[cmap_name]
        norm = Normalize(*span) if span else Normalize(0, 1)
        image = None
        for ax, node in zip(axes[r], nodes, strict=True):
            grid = np.full((len(rows), len(cols)), np.nan)
            for p in present:
                stats = view.stats.get((node, p["device"]))
                value = getattr(stats, key) if stats else None
                y, x = rows.index(p["row"]), cols.index(p["col"])
                if value is not None:
                    grid[y, x] = value
                role = view.role(node, p["device"])
                slot = f"{p['slot']} (assumed)" if assumed else p["slot"]
                text = (f"{slot}\n{role.role if role else 'no samples'}\n"
                        + (f"{value:.0f} {unit}" if value is not None else "n/a"))
                dark = value is not None and _luminance(cmap(norm(value))) < 0.5
                ax.text(x, y, text, ha="center", va="center", fontsize=7,
                        color="white" if dark else "black")
            image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto")
            ax.set_facecolor("0.85")
            ax.set_xticks(range(len(cols)), [f"col {c}" for c in cols], fontsize=7)
            ax.set_yticks(range(len(rows)), [f"row {y}" + (" (front)" if y == 0 else "")
                                             for y in rows], fontsize=7)
            ax.set_title(f"node {node}: {name}", fontsize=8.5)
        fig.colorbar(image, ax=list(axes[r]), label=f"{name} ({unit})", shrink=0.9,
                     fraction=0.05, pad=0.02)
    return fig


def throttle_steps(throttle: list[DeviceSeries], bit: int) -> tuple[np.ndarray, np.ndarray]:
    """Share of devices with ``bit`` set, as a step function over all sample times.

    Each device holds its last reading until its next one; a device counts from its first
    reading on. Returns (times, share) with share in 0..1.
    """
    times, values = held(throttle)
    seen = ~np.isnan(values)
    on = (np.nan_to_num(values).astype(np.int64) & bit) != 0
    count = seen.sum(0)
    return times, np.where(count > 0, (on & seen).sum(0) / np.maximum(count, 1), 0.0)


def _throttle_panel(ax: Any, view: RunView) -> None:
    """Per reason, a filled band as high as the share of devices with it active."""
    names = list(THROTTLE_BITS)
    focus = view.axis.measured if view.axis else None
    for row, bit in enumerate(THROTTLE_BITS.values()):
        times, share = throttle_steps(view.throttle, bit)
        ax.fill_between(times, row - 0.4, row - 0.4 + 0.8 * share, step="post",
                        color="#c0392b", lw=0)
        pooled = np.concatenate([((s.value.astype(np.int64) & bit) != 0)[
            (s.t >= focus[0]) & (s.t <= focus[1])] if focus else
            ((s.value.astype(np.int64) & bit) != 0) for s in view.throttle])
        if len(pooled):
            ax.text(1.01, row, f"{pooled.mean():.0%}", transform=ax.get_yaxis_transform(),
                    va="center", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7.5)
    ax.set_ylim(-0.5, len(names) - 0.5)
    ax.set_ylabel("throttle reason")
    ax.grid(axis="y", alpha=0.3, lw=0.5)
    where = "measured steps" if focus else "all samples"
    ax.text(1.01, len(names) - 0.3, f"share of\n{where}", transform=ax.get_yaxis_transform(),
            va="bottom", fontsize=7)


def clock_and_throttle(view: RunView, scales: Scales) -> Figure | None:
    """SM clock of every device over time, and when each throttle reason was active."""
    if view.axis is None or not (view.clock or view.throttle):
        return None
    fig, (top, bottom) = figure_and_axes((11, 5.6), 2, 1, sharex=True, height_ratios=(3, 2))
    mark_steps(top, view.axis)
    handles, names = _lines(top, view, view.clock)
    extra = step_handles(view.axis)
    for clock_max in view.clock_max_mhz:
        line = top.axhline(clock_max, color="black", ls="--", lw=0.8)
        extra = ([*extra[0], line], [*extra[1], f"max SM clock {clock_max:.0f} MHz"])
    if not view.clock:
        top.text(0.5, 0.5, "SM clock not measured", ha="center", transform=top.transAxes)
    elif scales.clock_mhz:
        top.set_ylim(*scales.clock_mhz)
    top.set_ylabel("SM clock (MHz)")
    _legend(top, handles, names, extra)
    set_time_axis(top, view.axis)
    mark_steps(bottom, view.axis)
    if view.throttle:
        _throttle_panel(bottom, view)
    else:
        bottom.set_yticks([])
        bottom.text(0.5, 0.5, "throttle reasons not measured", ha="center", va="center",
                    transform=bottom.transAxes, fontsize=9, color="0.3")
    set_time_axis(bottom, view.axis)
    bottom.set_xlabel(time_label(view.axis))
    lines = title(fig, "SM clock and throttle reasons (band height: share of devices)", view)
    place_axes(fig, 1.0, max(legends_width(fig), 1.1) + 0.15, title_height(lines), 0.55,
               gap=0.25)
    return fig


def kernel_breakdown(times: dict[str, dict[str, float]], view: RunView) -> Figure | None:
    """Share of kernel time per category, one stacked bar per profiled trace (None if none)."""
    from kit.analysis.kernels import CATEGORIES, OTHER

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
