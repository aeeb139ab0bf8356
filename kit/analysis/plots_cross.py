"""Figures across configurations, the study's per-configuration views; each a ``Figure``.

One point, bar or row per configuration (a :class:`~kit.analysis.compare.Group`; for per-GPU
figures its first run), all on one scale. Configurations are drawn in :func:`figure_order`:
by workload as first given, fastest first, runs that did not end ok last. They are named by
their short labels (the parts all configurations share are left out and said in the caption).
A value nobody measured is said, never drawn as 0.
"""

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from kit.analysis.compare import Comparison, Group, figure_order
from kit.analysis.plots_common import (
    STATUS_COLOR,
    category_colors,
    colors,
    legend_outside,
    percent_axis,
    row_names,
    share_bars,
)
from kit.analysis.run_view import RunView
from kit.bundle.reader import Bundle
from kit.metrics.kernels import COLLECTIVES, COMPUTE, IDLE, category_totals, read_breakdowns
from kit.metrics.text import format_value


def _name(c: Comparison, g: Group) -> str:
    return g.short + (" (baseline)" if c.baseline is not None and c.groups[c.baseline] is g
                      else "")


BAR_METRICS: tuple[tuple[str, str], ...] = (
    ("tokens_per_s", "throughput (tokens/s)"),
    ("mfu", "MFU"),
    ("energy_j_per_token", "energy per token (J)"),
    ("power_w_peak", "peak power (W)"),
    ("power.excursion_s", "excursion time (s)"),
)
"""Keys and axis labels of the per-configuration bars."""


def configuration_bars(c: Comparison) -> Figure:
    """Throughput, MFU, energy per token and peak power per configuration.

    The median is a bar and min..max a whisker; a failed/OOM/interrupted group is marked with
    its status and a value no run measured says n/a: neither is drawn as a zero.
    """
    groups = figure_order(c)
    fig = Figure(figsize=(13, 1.3 + 0.42 * len(groups)), layout="constrained")
    axes = fig.subplots(1, len(BAR_METRICS))
    for ax, (key, label) in zip(axes, BAR_METRICS, strict=True):
        unit = "fraction" if key == "mfu" else ""
        aggs = [g.values[key] for g in groups]
        known = [a.max for a in aggs if a.max is not None]
        xmax = max(known) * 1.3 if known and max(known) > 0 else 1.0
        drawn = []
        for i, (g, a) in enumerate(zip(groups, aggs, strict=True)):
            if g.status != "ok":
                ax.axhspan(i - 0.35, i + 0.35, color="#f4b6b6", alpha=0.6, lw=0)
                ax.text(xmax * 0.02, i, f"{g.status.upper()}: no measured steps", va="center",
                        color=STATUS_COLOR, fontsize=7.5, fontweight="bold")
            elif a.median is None:
                ax.text(xmax * 0.02, i, "n/a (not measured)", va="center", color="0.35",
                        fontsize=7.5)
            else:
                drawn.append((i, a))
                ax.text(a.max + xmax * 0.02, i, format_value(a.median, unit), va="center",
                        fontsize=7.5)
        if drawn:  # all bars in one call, all whiskers in another (one artist each, not per row)
            ax.barh([i for i, _ in drawn], [a.median for _, a in drawn], height=0.6,
                    color="#4c78a8")
            spread = [(i, a) for i, a in drawn if a.min != a.max]
            if spread:
                ax.errorbar([a.median for _, a in spread], [i for i, _ in spread],
                            xerr=[[a.median - a.min for _, a in spread],
                                  [a.max - a.median for _, a in spread]],
                            fmt="none", color="black", capsize=3, lw=1)
        ax.set_xlim(0, xmax)
        if key == "mfu":
            ax.xaxis.set_major_formatter(lambda v, _: f"{v * 100:.0f}%")
        ax.set_title(label, fontsize=9)
        ax.grid(axis="x", alpha=0.3, lw=0.5)
        ax.tick_params(axis="x", labelsize=7.5)
    row_names(axes, [_name(c, g) for g in groups], 8)  # each a full row from the axis
    runs = sum(len(g.bundles) for g in groups)
    fig.suptitle(f"Per configuration: median over repeats (whiskers: min..max), {runs} runs",
                 fontsize=10)
    return fig


def _samples_per_mj(g: Group) -> float | None:
    """Training samples (sequences) per megajoule of device energy."""
    energy = g.values["energy_j_per_token"].median
    seq = g.first.workload.get("seq_length")
    return 1e6 / (energy * seq) if energy and seq else None


def efficiency(c: Comparison) -> Figure | None:
    """Throughput against energy per token, coloured by mean power; samples per MJ beside.

    None when no configuration has both throughput and energy per token.
    """
    ordered = figure_order(c)
    groups = [g for g in ordered if g.values["tokens_per_s"].median is not None
              and g.values["energy_j_per_token"].median is not None]
    if not groups:
        return None
    left_out = [_name(c, g) for g in ordered if all(g is not x for x in groups)]
    from matplotlib import colormaps
    from matplotlib.colors import Normalize, to_rgba
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(13, max(4.2, 1.4 + 0.36 * len(groups))), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(3, 2))
    left.xaxis.set_major_locator(MaxNLocator(5))
    power = [g.values["power_w_mean"].median for g in groups]
    known = [p for p in power if p is not None]
    norm = Normalize(min(known) - 1, max(known) + 1) if known else Normalize(0, 1)
    cmap = colormaps["plasma"]
    points = [(g.values["energy_j_per_token"].median, g.values["tokens_per_s"].median)
              for g in groups]
    left.scatter(*zip(*points, strict=True), s=70, zorder=3, edgecolor="black", lw=0.6,
                 color=[cmap(norm(p)) if p is not None else to_rgba("0.6") for p in power])
    for g, (x, y) in zip(groups, points, strict=True):
        left.annotate(_name(c, g), (x, y), textcoords="offset points", xytext=(6, 4),
                      fontsize=7).set_in_layout(False)
    left.set_xlabel("energy per token (J), lower is better")
    left.set_ylabel("throughput (tokens/s), higher is better")
    left.grid(alpha=0.3, lw=0.5)
    xs = [g.values["energy_j_per_token"].median for g in groups]
    ys = [g.values["tokens_per_s"].median for g in groups]
    dx, dy = (max(xs) - min(xs)) or max(xs) * 0.2, (max(ys) - min(ys)) or max(ys) * 0.2
    left.set_xlim(min(xs) - 0.15 * dx, max(xs) + 0.6 * dx)  # room for the names
    left.set_ylim(min(ys) - 0.2 * dy, max(ys) + 0.2 * dy)
    if known:
        fig.colorbar(cmap_scalar(norm, cmap), ax=left, label="mean power per device (W)",
                     location="bottom", shrink=0.6, aspect=40)
    ranked = sorted(((_samples_per_mj(g), g) for g in groups),
                    key=lambda x: -(x[0] or 0.0))
    for i, (value, _) in enumerate(ranked):
        if value is None:
            right.text(0, i, " n/a (no sequence length)", va="center", fontsize=7.5)
            continue
        right.barh(i, value, height=0.6, color="#59a14f")
        right.text(value, i, f" {value:,.0f}", va="center", fontsize=7.5).set_in_layout(False)
    right.set_yticks(range(len(ranked)), [_name(c, g) for _, g in ranked], fontsize=7.5)
    right.invert_yaxis()
    right.set_xlabel("samples (sequences) per MJ of device energy")
    right.grid(axis="x", alpha=0.3, lw=0.5)
    right.margins(x=0.25)
    title = "Energy efficiency per configuration (medians over repeats)"
    if left_out:
        title += "\nnot shown, no throughput or energy per token: " + "; ".join(left_out)
    fig.suptitle(title, fontsize=10)
    return fig


def cmap_scalar(norm: Any, cmap: Any) -> Any:
    """A colour-bar source for ``norm`` and ``cmap`` without an image."""
    from matplotlib.cm import ScalarMappable

    return ScalarMappable(norm=norm, cmap=cmap)


_PER_GPU = (("power", "power (W)", "power_mean", "power_max", "peak"),
            ("temp", "GPU temperature (°C)", "temp_mean", "temp_max", "max"),
            ("clock", "SM clock (MHz)", "clock_mean", "clock_min", "min"))


def _gpu_rows(c: Comparison, views: dict[str, RunView]) -> list[tuple[str, Any, RunView | None]]:
    """Rows of the per-GPU chart: a header per configuration, then one per GPU with stats."""
    rows: list[tuple[str, Any, RunView | None]] = []
    for g in figure_order(c):
        view = views.get(g.label)  # none for a projection
        if view is None or not view.stats:
            continue
        scope = "" if view.scope == "measured steps" else f" ({view.scope})"
        rows.append((f"{_name(c, g)}{scope}", None, view))
        for role in view.roles:
            stats = view.stats.get((role.node, role.device))
            if stats is not None:
                rows.append((f"{role.place} · {role.role}", stats, view))
    return rows


def per_gpu(c: Comparison, views: dict[str, RunView]) -> Figure | None:
    """Per GPU of each configuration: mean and peak power, mean and max temperature, mean and
    lowest SM clock over its measured steps (the run's first; the whole record of a run
    without steps). None when no configuration has GPU telemetry.
    """
    rows = _gpu_rows(c, views)
    if not rows:
        return None
    fig = Figure(figsize=(13, 1.5 + 0.22 * len(rows)), layout="constrained")
    axes = fig.subplots(1, len(_PER_GPU))
    for ax, (_, label, mean_key, extreme_key, extreme) in zip(axes, _PER_GPU, strict=True):
        means = [getattr(s, mean_key) for _, s, _ in rows if s is not None]
        if not any(v is not None for v in means):
            ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center")
        # one artist per kind, not per row: a row's bar, tick and rule each cost a 100-bundle
        # report's figure as much to build and draw as the whole rest of it
        headers = [i for i, (_, stats, _) in enumerate(rows) if stats is None]
        bars = [(i, getattr(s, mean_key), "#e15759" if view is not None and
                 view.bundle.manifest.status != "ok" else "#4c78a8")
                for i, (_, s, view) in enumerate(rows)
                if s is not None and getattr(s, mean_key) is not None]
        tops = [(i, getattr(s, extreme_key)) for i, (_, s, _) in enumerate(rows)
                if s is not None and getattr(s, extreme_key) is not None]
        if headers:
            ax.hlines(headers, 0, 1, transform=ax.get_yaxis_transform(), color="0.6", lw=0.5)
        if bars:
            ys, widths, fill = zip(*bars, strict=True)
            ax.barh(ys, widths, height=0.7, color=fill)
        if tops:
            ys, xs = zip(*tops, strict=True)
            ax.plot(xs, ys, ls="none", marker="|", color="black", ms=8, mew=1.5)
        if mean_key == "power_mean":
            for limit in sorted({w for v in views.values() for w in v.power_limits_w}):
                ax.axvline(limit, color=STATUS_COLOR, ls="--", lw=0.8)
                ax.text(limit, len(rows) - 0.4, f"limit {limit:.0f} W ", fontsize=6.5,
                        ha="right", va="bottom", color=STATUS_COLOR)
        known = [v for _, s, _ in rows if s is not None
                 for v in (getattr(s, mean_key), getattr(s, extreme_key)) if v is not None]
        if known and mean_key == "power_mean":
            limits = [w for v in views.values() for w in v.power_limits_w]
            ax.set_xlim(0, max(known + limits) * 1.08)
        elif known:
            span = max(known) - min(known)
            ax.set_xlim(min(known) - 0.2 * span - 1, max(known) + 0.1 * span + 1)
        ax.set_title(f"{label}: mean bar, {extreme} tick", fontsize=8.5)
        ax.grid(axis="x", alpha=0.3, lw=0.5)
        ax.tick_params(axis="x", labelsize=7.5)
    row_names(axes, [name for name, _, _ in rows], 7, top=-0.6)
    for tick, (_, stats, _) in zip(axes[0].get_yticklabels(), rows, strict=True):
        if stats is None:
            tick.set_fontweight("bold")
    fig.suptitle("Per GPU and configuration (red: a run that did not end ok); GPUs by node, "
                 "slot and rank (r, pp stage, tp/cp/ep rank)", fontsize=9.5)
    return fig


_HEAT = (("temp_mean", "mean GPU temperature (°C)", "inferno", "{:.0f}"),
         ("power_mean", "mean power (W)", "viridis", "{:.0f}"),
         ("link_gbps", "NVLink/xGMI traffic\nsent + received (GB/s)", "Blues", "{:.1f}"))


def gpu_heatmap(c: Comparison, views: dict[str, RunView]) -> Figure | None:
    """Configurations by GPUs in node order: mean temperature, mean power and link traffic
    (when recorded), each on one colour scale. None without GPU telemetry.
    """
    groups = [g for g in figure_order(c) if g.label in views and views[g.label].stats]
    if not groups:
        return None
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    columns = sorted({key for g in groups for key in views[g.label].stats})
    slots = {(r.node, r.device): r.place for g in groups for r in views[g.label].roles}
    panels = [p for p in _HEAT if any(getattr(s, p[0]) is not None
                                      for g in groups for s in views[g.label].stats.values())]
    side = len(columns) <= 8  # few GPUs: panels side by side, sharing the configuration axis
    cell_w, cell_h = 0.95, 0.42
    if side:
        fig = Figure(figsize=(max(9.0, 3.5 + len(panels) * (1.3 + cell_w * len(columns))),
                              1.6 + cell_h * len(groups)), layout="constrained")
        axes = fig.subplots(1, len(panels), squeeze=False)[0]  # rows: row_names' reason
    else:
        fig = Figure(figsize=(min(3.5 + cell_w * len(columns), 20),
                              1.2 + len(panels) * (0.9 + cell_h * len(groups))),
                     layout="constrained")
        axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for n, (ax, (key, label, cmap_name, fmt)) in enumerate(zip(axes, panels, strict=True)):
        grid = np.full((len(groups), len(columns)), np.nan)
        for y, g in enumerate(groups):
            for x, col in enumerate(columns):
                stats = views[g.label].stats.get(col)
                value = getattr(stats, key) if stats else None
                if value is not None:
                    grid[y, x] = value
        ok = np.array([g.status == "ok" for g in groups])
        known = grid[ok][~np.isnan(grid[ok])]  # failed runs' idle GPUs do not set the scale
        if not len(known):
            known = grid[~np.isnan(grid)]
        norm = Normalize(float(known.min()) - 0.5, float(known.max()) + 0.5)
        cmap = colormaps[cmap_name]
        image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto")
        ax.set_facecolor("0.9")
        for y, g in enumerate(groups):
            for x, col in enumerate(columns):
                if np.isnan(grid[y, x]):
                    continue
                role = views[g.label].role(*col)
                dark = sum(cmap(norm(grid[y, x]))[:3]) < 1.5
                named = role is not None and len(columns) <= 16  # else no room: see per-gpu
                ax.text(x, y, fmt.format(grid[y, x]) + (f"\n{role.role}" if named else ""),
                        ha="center", va="center", fontsize=6.5,
                        color="white" if dark else "black")
        ax.set_xticks(range(len(columns)), [slots[col] for col in columns], fontsize=7,
                      rotation=90 if len(columns) > 8 else 0)
        if n == 0 or not side:
            ax.set_yticks(range(len(groups)), [_name(c, g) for g in groups], fontsize=7.5)
        else:
            ax.set_yticks([])
        ax.set_title(label, fontsize=8.5, wrap=True)
        fig.colorbar(image, ax=ax, shrink=0.9, location="bottom" if side else "right",
                     aspect=15 if side else 20)
    fig.suptitle("GPUs in node order (n = node, slot) per configuration, over the measured "
                 "steps, with the rank each GPU ran", fontsize=9.5)
    return fig


def _stage_shares(bundle: Bundle) -> dict[int, tuple[dict[str, float], list[int]]]:
    """Per pipeline stage: mean share per category over its profiled ranks, and the ranks."""
    out: dict[int, tuple[dict[str, float], list[int]]] = {}
    for rank in read_breakdowns(bundle):
        totals = category_totals(rank)
        total = sum(totals.values())
        if not total:
            continue
        shares, ranks = out.setdefault(rank.stage, ({}, []))
        ranks.append(rank.rank)
        for cat, v in totals.items():
            shares[cat] = shares.get(cat, 0.0) + v / total
    return {stage: ({k: v / len(r) for k, v in s.items()}, r)
            for stage, (s, r) in sorted(out.items())}


def stage_breakdown(c: Comparison) -> Figure | None:
    """Share of the profiled steps per category, per configuration and pipeline stage (mean
    over the stage's profiled ranks of the configuration's first profiled run); None when no
    run has a profile breakdown.
    """
    rows = []
    for g in figure_order(c):
        bundle = next((b for b in g.bundles if read_breakdowns(b)), None)
        if bundle is None:
            continue
        for stage, (shares, ranks) in _stage_shares(bundle).items():
            rows.append((f"{_name(c, g)}\nstage {stage}, ranks "
                         f"{', '.join(map(str, ranks))}", shares))
    if not rows:
        return None
    cats = [k for k in (*COMPUTE, *COLLECTIVES, IDLE) if any(k in s for _, s in rows)]
    palette = category_colors()
    fig = Figure(figsize=(12, 1.6 + 0.5 * len(rows)), layout="constrained")
    ax = fig.add_subplot()
    share_bars(ax, rows, cats, palette,
               "share of the profiled steps (hatched: exposed communication)",
               hatched=frozenset(COLLECTIVES))
    fig.suptitle("Where the profiled time goes, per configuration and pipeline stage",
                 fontsize=10)
    return fig


def comm_shares(bundle: Bundle) -> tuple[dict[str, float], dict[str, float]] | None:
    """Exposed and overlapped time per collective type as shares of the profiled steps'
    windows, over all profiled ranks and steps.
    """
    window = 0.0
    exposed: dict[str, float] = {}
    overlapped: dict[str, float] = {}
    for rank in read_breakdowns(bundle):
        for step in rank.steps:
            window += step.window_s
            for cat in step.categories:
                if cat.kind == "communication":
                    exposed[cat.category] = exposed.get(cat.category, 0.0) + (cat.exposed_s or 0)
                    overlapped[cat.category] = (overlapped.get(cat.category, 0.0)
                                                + (cat.overlapped_s or 0))
    if not window:
        return None
    return ({k: v / window for k, v in exposed.items()},
            {k: v / window for k, v in overlapped.items()})


def exposed_communication(c: Comparison) -> Figure | None:
    """Communication per configuration by collective type: exposed (nothing computed
    meanwhile) and overlapped with compute, as shares of the profiled steps.
    """
    rows = []
    for g in figure_order(c):
        found = next((s for b in g.bundles if (s := comm_shares(b)) is not None), None)
        if found is not None:
            rows.append((_name(c, g), *found))
    if not rows:
        return None
    cats = [k for k in COLLECTIVES if any(k in r[1] or k in r[2] for r in rows)]
    palette = category_colors()
    fig = Figure(figsize=(12, 1.6 + 0.38 * len(rows)), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for ax, part, label in zip(axes, (1, 2), ("exposed: nothing computed meanwhile",
                                                "overlapped with compute"), strict=True):
        top = max((sum(r[part].values()) for r in rows), default=0.0)
        for i, row in enumerate(rows):
            left = 0.0
            for cat in cats:
                share = row[part].get(cat, 0.0)
                if share > 0:
                    ax.barh(i, share, left=left, color=palette[cat], height=0.6,
                            label=cat if cat not in ax.get_legend_handles_labels()[1] else None)
                    left += share
            ax.text(left, i, f" {left:.1%}", va="center", fontsize=7)
        ax.set_xlim(0, max(top * 1.3, 0.01))
        percent_axis(ax.xaxis)
        ax.set_title(label, fontsize=9)
        ax.grid(axis="x", alpha=0.3, lw=0.5)
    axes[0].set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=7.5)
    axes[0].invert_yaxis()
    handles, labels = axes[0].get_legend_handles_labels()
    legend_outside(axes[1], handles, labels)
    fig.supxlabel("share of the profiled steps' time, all profiled ranks", fontsize=8.5)
    fig.suptitle("Communication per configuration, by collective type", fontsize=10)
    return fig


def fabric_busbw(curves: list[tuple[Bundle, Any]]) -> Figure | None:
    """Bus bandwidth against message size, one panel per collective, one line per bundle."""
    if not curves:
        return None
    ops = sorted({p.op for _, r in curves for p in r.points})
    fig = Figure(figsize=(4 * len(ops) + 2.5, 3.4), layout="constrained")
    axes = fig.subplots(1, len(ops), sharey=True, squeeze=False)[0]
    palette = colors(len(curves))
    for ax, op in zip(axes, ops, strict=True):
        for color, (bundle, results) in zip(palette, curves, strict=True):
            pts = sorted((p.size_bytes, p.busbw_gbps) for p in results.points if p.op == op)
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", ms=3, color=color,
                        label=f"{bundle.path.name} ({results.ranks} {results.backend})")
        ax.set_xscale("log", base=2)
        ax.set_title(op, fontsize=9)
        ax.set_xlabel("message size S (bytes)", fontsize=8)
        ax.grid(alpha=0.3, lw=0.5)
    axes[0].set_ylabel("busbw (GB/s)")
    handles, labels = axes[0].get_legend_handles_labels()
    legend_outside(axes[-1], handles, labels)
    fig.suptitle("Fabric: bus bandwidth as nccl-tests defines it", fontsize=10)
    return fig
