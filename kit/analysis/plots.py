"""Figures of the report, modelled on the reference study's, each a matplotlib ``Figure``.

Figures are built with ``matplotlib.figure.Figure`` directly (no pyplot), so drawing never
touches a global backend or opens a window; :func:`png_bytes` renders one with Agg. A figure
function returns None when the bundle holds nothing it could draw (the report then says
why), never an empty or zero-filled plot.

Time axes are seconds from the first step's start. Step markers shade every step window,
warmup steps in orange and measured steps in alternating greys, as in the study's traces.
"""

import io
import re
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from kit.analysis.attribution import MEASURED, StepWindows, step_windows
from kit.analysis.compare import Comparison
from kit.analysis.compare_format import format_value
from kit.analysis.power import device_metrics
from kit.bundle.reader import Bundle
from kit.telemetry.fields import THROTTLE_BITS

DPI = 110
_PAD_S = 2.0
"""Seconds of telemetry shown before the first step and after the last."""
_LEGEND_MAX = 8
"""Devices named in a legend; more are drawn without one."""


class DeviceSeries(NamedTuple):
    """One device's samples of one field, time in seconds from the first step."""

    node: int
    device: int
    t: np.ndarray
    value: np.ndarray


def png_bytes(fig: Figure) -> bytes:
    """Render ``fig`` to PNG with the Agg backend."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def bundle_title(bundle: Bundle) -> str:
    """Short title: workload, platform and world size, bundle id."""
    m = bundle.manifest
    return (f"{m.workload['name']} on {m.platform['name']} x{len(m.ranks)} "
            f"({bundle.path.name})")


def _origin(windows: StepWindows) -> float | None:
    return float(windows.start.min()) if len(windows.start) else None


def gpu_series(telemetry: pa.Table, field: str, t0: float) -> list[DeviceSeries]:
    """Per GPU, the non-null samples of ``field`` in time order."""
    gpu = telemetry.filter(pc.and_(pc.equal(telemetry["source"], "gpu"),
                                   pc.is_valid(telemetry[field])))
    if gpu.num_rows == 0:
        return []
    node, dev = gpu["node"].to_numpy(), gpu["device"].to_numpy()
    t = gpu["t"].to_numpy() - t0
    value = gpu[field].to_numpy().astype(float)
    out = []
    for n, d in sorted({(int(a), int(b)) for a, b in zip(node, dev, strict=True)}):
        rows = np.flatnonzero((node == n) & (dev == d))
        rows = rows[np.argsort(t[rows], kind="stable")]
        out.append(DeviceSeries(n, d, t[rows], value[rows]))
    return out


def host_series(telemetry: pa.Table, field: str, t0: float) -> list[DeviceSeries]:
    """Per node, the non-null host samples of ``field`` in time order (device -1)."""
    host = telemetry.filter(pc.and_(pc.equal(telemetry["source"], "host"),
                                    pc.is_valid(telemetry[field])))
    node = host["node"].to_numpy()
    t, value = host["t"].to_numpy() - t0, host[field].to_numpy().astype(float)
    out = []
    for n in sorted({int(x) for x in node}):
        rows = np.flatnonzero(node == n)
        rows = rows[np.argsort(t[rows], kind="stable")]
        out.append(DeviceSeries(n, -1, t[rows], value[rows]))
    return out


def _mark_steps(ax: Any, windows: StepWindows, t0: float) -> None:
    """Shade each step window: warmup orange, measured alternating greys."""
    measured = warmup = 0
    for start, end, phase in zip(windows.start - t0, windows.end - t0, windows.phase,
                                 strict=True):
        if phase == MEASURED:
            color = ("0.80", "0.90")[measured % 2]
            measured += 1
        else:
            color = ("#f6c88f", "#fadcb5")[warmup % 2]
            warmup += 1
        ax.axvspan(start, end, color=color, alpha=0.6, lw=0, zorder=0)


def _time_limits(ax: Any, windows: StepWindows, t0: float) -> None:
    ax.set_xlim(-_PAD_S, float(windows.end.max() - t0) + _PAD_S)


def _device_lines(ax: Any, series: list[DeviceSeries], ylabel: str,
                  legend_loc: str = "upper right") -> None:
    colors = _colors(len(series))
    for s, color in zip(series, colors, strict=True):
        where = f"dev {s.device}" if s.device >= 0 else "host"
        ax.plot(s.t, s.value, lw=0.9, color=color, label=f"node {s.node} {where}")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, lw=0.5)
    if len(series) <= _LEGEND_MAX:
        ax.legend(loc=legend_loc, fontsize=7, framealpha=0.9)


def _colors(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "viridis"]
    return [cmap(i if n <= 10 else i / max(n - 1, 1)) for i in range(n)]


def _step_legend(ax: Any) -> None:
    """A second legend for the step shading, leaving the devices' legend in place."""
    from matplotlib.legend import Legend
    from matplotlib.patches import Patch

    handles = [Patch(color="#f6c88f", alpha=0.6), Patch(color="0.80", alpha=0.6)]
    ax.add_artist(Legend(ax, handles, ["warmup step", "measured step"], loc="upper left",
                         fontsize=7, framealpha=0.9))


def power_timeline(bundle: Bundle) -> Figure | None:
    """Power of every device over time with the step windows marked (GPU, else host RAPL)."""
    windows = step_windows(bundle.steps)
    t0 = _origin(windows)
    if t0 is None:
        return None
    series = gpu_series(bundle.telemetry, "power_w", t0)
    label = "board power (W)"
    if not series:
        series = host_series(bundle.telemetry, "cpu_power_w", t0)
        label = "CPU package power (W)"
    if not series:
        return None
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    ax = fig.add_subplot()
    _mark_steps(ax, windows, t0)
    _device_lines(ax, series, label)
    _step_legend(ax)
    _time_limits(ax, windows, t0)
    shown = _visible(series, windows, t0)
    if len(shown):
        ax.set_ylim(0, float(shown.max()) * 1.1)
    ax.set_xlabel("time from first step (s)")
    ax.set_title(f"Power per device: {bundle_title(bundle)}", fontsize=10)
    return fig


def _device_facts(bundle: Bundle) -> list[dict[str, Any]]:
    return [{"node": i, **g} for i, node in enumerate(bundle.manifest.inventory)
            for g in node.gpus]


def per_device_means(bundle: Bundle) -> list[dict[str, Any]]:
    """Each device's figures over the measured steps (:func:`kit.analysis.power.device_metrics`)."""
    config = bundle.manifest.config
    tokens = config["global_batch_size"] * bundle.manifest.workload.get("seq_length", 0)
    per_device, _ = device_metrics(bundle.telemetry, bundle.steps, _device_facts(bundle), tokens)
    return per_device


def _luminance(rgba: tuple[float, ...]) -> float:
    """Relative luminance of a colour (ITU-R BT.709 weights), to pick black or white text."""
    return 0.2126 * rgba[0] + 0.7152 * rgba[1] + 0.0722 * rgba[2]


def _chassis_grid(ax: Any, chassis: list[dict[str, Any]], values: dict[int, float],
                  unit: str, norm: Any, cmap: Any) -> Any:
    """Draw one node's devices at their chassis (row, col); devices not in the run are grey."""
    rows = 1 + max(p["row"] for p in chassis)
    cols = 1 + max(p["col"] for p in chassis)
    grid = np.full((rows, cols), np.nan)
    for p in chassis:
        if p["device"] in values:
            grid[p["row"], p["col"]] = values[p["device"]]
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto")
    ax.set_facecolor("0.85")
    for p in chassis:
        v = values.get(p["device"])
        text = f"{p['slot']}\ndev {p['device']}\n" + (f"{v:.0f} {unit}" if v is not None
                                                       else "not in run")
        dark = v is not None and _luminance(cmap(norm(v))) < 0.5
        ax.text(p["col"], p["row"], text, ha="center", va="center", fontsize=7.5,
                color="white" if dark else "black")
    ax.set_xticks(range(cols))
    ax.set_yticks(range(rows))
    ax.set_yticklabels([f"row {r}" + (" (front)" if r == 0 else "") for r in range(rows)],
                       fontsize=7)
    ax.set_xticklabels([f"col {c}" for c in range(cols)], fontsize=7)
    return image


def chassis_heatmaps(bundle: Bundle) -> Figure | None:
    """Mean temperature and power of each device over the measured steps, by chassis position.

    Rows are the quantity, columns the nodes; a device slot the run did not use is grey.
    """
    chassis = bundle.manifest.platform.get("chassis") or []
    per_device = per_device_means(bundle)
    if not chassis or not per_device:
        return None
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    nodes = len(bundle.manifest.inventory)
    quantities = [("temp_gpu_c_mean", "mean GPU temperature", "C", "inferno"),
                  ("power_w_mean", "mean power", "W", "viridis")]
    fig = Figure(figsize=(max(min(4.6 * nodes, 17) + 1.2, 8.0), 5.8), layout="constrained")
    axes = fig.subplots(len(quantities), nodes, squeeze=False)
    for row, (key, name, unit, cmap) in enumerate(quantities):
        known = [d[key] for d in per_device if d[key] is not None]
        if not known:
            for ax in axes[row]:
                ax.set_axis_off()
                ax.text(0.5, 0.5, f"{name}: not measured", ha="center", transform=ax.transAxes)
            continue
        lo, hi = min(known), max(known)
        norm = Normalize(lo - 1, hi + 1) if hi - lo < 2 else Normalize(lo, hi)
        image = None
        for node in range(nodes):
            values = {d["device"]: d[key] for d in per_device
                      if d["node"] == node and d[key] is not None}
            image = _chassis_grid(axes[row][node], chassis, values, unit, norm,
                                  colormaps[cmap])
            axes[row][node].set_title(f"node {node}: {name}", fontsize=9)
        fig.colorbar(image, ax=list(axes[row]), label=f"{name} ({unit})", shrink=0.9)
    fig.suptitle(f"Devices by chassis position (row 0 = air inlet)\n{bundle_title(bundle)}",
                 fontsize=9)
    return fig


def _visible(series: list[DeviceSeries], windows: StepWindows, t0: float) -> np.ndarray:
    """All samples of ``series`` inside the plotted time range."""
    lo, hi = -_PAD_S, float(windows.end.max() - t0) + _PAD_S
    return np.concatenate([s.value[(s.t >= lo) & (s.t <= hi)] for s in series])


def _clock_range(ax: Any, clocks: list[DeviceSeries], windows: StepWindows, t0: float,
                 facts: list[dict[str, Any]]) -> None:
    """Mark each distinct maximum SM clock and fit the y range to the samples shown."""
    for clock_max in sorted({f["clock_sm_max_mhz"] for f in facts if f.get("clock_sm_max_mhz")}):
        ax.axhline(clock_max, color="black", ls="--", lw=0.8)
        ax.annotate(f"max {clock_max:.0f} MHz", (1, clock_max), xycoords=("axes fraction", "data"),
                    ha="right", va="bottom", fontsize=7)
    shown = _visible(clocks, windows, t0)
    if len(shown):
        top = max(float(shown.max()), max((f.get("clock_sm_max_mhz") or 0 for f in facts),
                                          default=0))
        ax.set_ylim(float(shown.min()) * 0.9, top * 1.04)


_BINS = 600
"""Time bins of the throttle strip."""


def throttle_share(throttle: list[DeviceSeries], lo: float, hi: float) -> np.ndarray | None:
    """Share of throttle samples with each reason's bit set, per reason and time bin.

    Samples are pooled over devices (as ``throttle_frac`` is); a bin without samples is NaN.
    None when there are no throttle readings at all.
    """
    if not throttle:
        return None
    edges = np.linspace(lo, hi, _BINS + 1)
    total = np.zeros(_BINS)
    on = np.zeros((len(THROTTLE_BITS), _BINS))
    for s in throttle:
        total += np.histogram(s.t, edges)[0]
        bits = s.value.astype(np.int64)
        for row, bit in enumerate(THROTTLE_BITS.values()):
            on[row] += np.histogram(s.t[(bits & bit) != 0], edges)[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, on / total, np.nan)


def clock_and_throttle(bundle: Bundle) -> Figure | None:
    """SM clock of every device over time, and when each throttle reason was active."""
    windows = step_windows(bundle.steps)
    t0 = _origin(windows)
    if t0 is None:
        return None
    clocks = gpu_series(bundle.telemetry, "clock_sm_mhz", t0)
    throttle = gpu_series(bundle.telemetry, "throttle", t0)
    if not clocks and not throttle:
        return None
    fig = Figure(figsize=(10, 5.2), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    _mark_steps(top, windows, t0)
    if clocks:
        _device_lines(top, clocks, "SM clock (MHz)", legend_loc="lower right")
        _clock_range(top, clocks, windows, t0, _device_facts(bundle))
    else:
        top.text(0.5, 0.5, "SM clock not measured", ha="center", transform=top.transAxes)
    _step_legend(top)
    top.set_title(f"SM clock and throttle reasons: {bundle_title(bundle)}", fontsize=10)
    _mark_steps(bottom, windows, t0)
    names = list(THROTTLE_BITS)
    lo, hi = -_PAD_S, float(windows.end.max() - t0) + _PAD_S
    share = throttle_share(throttle, lo, hi)
    if share is not None and np.nanmax(share, initial=0.0) > 0:
        image = bottom.imshow(np.ma.masked_where(~(share > 0), share), aspect="auto",
                              origin="lower", cmap="Reds", vmin=0, vmax=1,
                              extent=(lo, hi, -0.5, len(names) - 0.5), interpolation="nearest")
        fig.colorbar(image, ax=bottom, label="share of samples", pad=0.01, aspect=12)
    bottom.set_yticks(range(len(names)), names, fontsize=8)
    bottom.set_ylim(-0.5, len(names) - 0.5)
    bottom.set_ylabel("active reason")
    bottom.set_xlabel("time from first step (s)")
    if share is None or not np.nanmax(share, initial=0.0) > 0:
        bottom.text(0.5, 0.5, "throttle reasons not measured" if share is None
                    else "no throttle reason active", ha="center", va="center",
                    transform=bottom.transAxes, fontsize=9, color="0.3")
    bottom.grid(axis="y", alpha=0.3, lw=0.5)
    _time_limits(bottom, windows, t0)
    return fig


BAR_METRICS: tuple[tuple[str, str], ...] = (
    ("tokens_per_s", "throughput (tokens/s)"),
    ("mfu", "MFU"),
    ("energy_j_per_token", "energy per token (J)"),
    ("power_w_peak", "peak power (W)"),
)
"""Keys and axis labels of the per-configuration bars."""


def configuration_bars(comparison: Comparison) -> Figure:
    """Throughput, MFU, energy per token and peak power per configuration group.

    The median is a bar and min..max a whisker; a failed/OOM/interrupted group is marked with
    its status and a value no run measured says n/a: neither is drawn as a zero.
    """
    groups = comparison.groups
    fig = Figure(figsize=(13, 1.2 + 0.62 * len(groups)), layout="constrained")
    axes = fig.subplots(1, len(BAR_METRICS), sharey=True)
    y = np.arange(len(groups))
    for ax, (key, label) in zip(axes, BAR_METRICS, strict=True):
        unit = "fraction" if key == "mfu" else ""
        aggs = [g.values[key] for g in groups]
        known = [a.max for a in aggs if a.max is not None]
        xmax = max(known) * 1.3 if known and max(known) > 0 else 1.0
        for i, (g, a) in enumerate(zip(groups, aggs, strict=True)):
            if g.status != "ok":
                ax.axhspan(i - 0.35, i + 0.35, color="#f4b6b6", alpha=0.6, lw=0)
                ax.text(xmax * 0.02, i, f"{g.status.upper()}: no figure", va="center",
                        color="#a00000", fontsize=8, fontweight="bold")
            elif a.median is None:
                ax.text(xmax * 0.02, i, "n/a (not measured)", va="center", color="0.35",
                        fontsize=8)
            else:
                ax.barh(i, a.median, height=0.6, color="#4c78a8")
                if a.min != a.max:
                    ax.errorbar(a.median, i, xerr=[[a.median - a.min], [a.max - a.median]],
                                color="black", capsize=3, lw=1)
                ax.text(a.max + xmax * 0.02, i, format_value(a.median, unit), va="center",
                        fontsize=8)
        ax.set_xlim(0, xmax)
        if key == "mfu":
            ax.xaxis.set_major_formatter(lambda v, _: f"{v * 100:.0f}%")
        ax.set_title(label, fontsize=9)
        ax.grid(axis="x", alpha=0.3, lw=0.5)
        ax.tick_params(axis="x", labelsize=7.5)
    axes[0].set_yticks(y, ["\n".join((" ".join(g.header()[:2]), g.header()[2])) for g in groups],
                       fontsize=8)
    axes[0].invert_yaxis()
    runs = sum(len(g.bundles) for g in groups)
    fig.suptitle(f"Per configuration: median over repeats (whiskers: min..max), {runs} runs",
                 fontsize=10)
    return fig


_BUNDLE_STAMP = re.compile(r"\d{8}T\d{6}Z-")


def bundle_label(name: str) -> str:
    """A bundle id for a figure: without its leading UTC time, never cut, so the workload,
    platform and unique suffix that tell bundles apart all show."""
    return name[len(m.group()):] if (m := _BUNDLE_STAMP.match(name)) else name


def kernel_breakdown(times: dict[str, dict[str, float]], title: str) -> Figure | None:
    """Share of kernel time per category, one stacked bar per profiled trace (None if none)."""
    from kit.analysis.kernels import CATEGORIES, OTHER

    if not times:
        return None
    cats = [c for c, _ in CATEGORIES] + [OTHER]
    colors = dict(zip(cats, _colors(len(cats)), strict=True))
    fig = Figure(figsize=(10, 1.6 + 0.55 * len(times)), layout="constrained")
    ax = fig.add_subplot()
    labels = []
    for i, (trace, totals) in enumerate(times.items()):
        total = sum(totals.values())
        left = 0.0
        for cat in cats:
            share = totals.get(cat, 0.0) / total
            if share <= 0:
                continue
            ax.barh(i, share, left=left, color=colors[cat], height=0.6,
                    label=cat if cat not in ax.get_legend_handles_labels()[1] else None)
            if share >= 0.05:
                ax.text(left + share / 2, i, f"{share:.0%}", ha="center", va="center",
                        fontsize=7.5, color="white")
            left += share
        labels.append(f"{trace}\n{total * 1e3:.3g} ms")
    ax.set_yticks(range(len(times)), labels, fontsize=8)
    _share_axes(ax, "share of kernel time", -0.35 if len(times) < 3 else -0.15, 5)
    ax.set_title(f"Kernel time by category: {title}", fontsize=10)
    return fig


def _share_axes(ax: Any, xlabel: str, legend_y: float, ncol: int) -> None:
    """Finish a chart of stacked shares: first bar on top, 0-100% axis, legend below."""
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    ax.set_xlabel(xlabel)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, legend_y), ncol=ncol, fontsize=8,
              frameon=False)


def profile_breakdowns(shares: list[dict[str, Any]]) -> Figure | None:
    """Share of profiled time per category, one stacked bar per bundle and rank (None if none).

    ``shares`` is :func:`kit.analysis.side_by_side.profile_shares`; communication segments are
    hatched (their exposed time), ``idle`` is grey.
    """
    from kit.analysis.kernels import COLLECTIVES, COMPUTE, IDLE

    if not shares:
        return None
    cats = [c for c in (*COMPUTE, *COLLECTIVES, IDLE) if any(c in s["share"] for s in shares)]
    colors = dict(zip(cats, _colors(len(cats)), strict=True))
    colors[IDLE] = (0.8, 0.8, 0.8, 1.0)
    fig = Figure(figsize=(10, 1.8 + 0.45 * len(shares)), layout="constrained")
    ax = fig.add_subplot()
    for i, s in enumerate(shares):
        left = 0.0
        for cat in cats:
            share = s["share"].get(cat, 0.0)
            if share <= 0:
                continue
            ax.barh(i, share, left=left, color=colors[cat], height=0.6,
                    hatch="//" if cat in COLLECTIVES else None, edgecolor="white", lw=0.3,
                    label=cat if cat not in ax.get_legend_handles_labels()[1] else None)
            left += share
    ax.set_yticks(range(len(shares)), [f"{bundle_label(s['bundle'])}\nrank {s['rank']} stage "
                                       f"{s['stage']}, {s['profiled_s'] * 1e3:.4g} ms"
                                       for s in shares], fontsize=7.5)
    _share_axes(ax, "share of the profiled steps (hatched: exposed communication)",
                -0.25 if len(shares) < 4 else -0.1, 6)
    ax.set_title("Where the profiled time goes, per bundle and rank", fontsize=10)
    return fig


def fabric_busbw(curves: list[tuple[Bundle, Any]]) -> Figure | None:
    """Bus bandwidth against message size, one panel per collective, one line per bundle."""
    if not curves:
        return None
    ops = sorted({p.op for _, r in curves for p in r.points})
    fig = Figure(figsize=(4 * len(ops), 3.4), layout="constrained")
    axes = fig.subplots(1, len(ops), sharey=True, squeeze=False)[0]
    colors = _colors(len(curves))
    for ax, op in zip(axes, ops, strict=True):
        for color, (bundle, results) in zip(colors, curves, strict=True):
            pts = sorted((p.size_bytes, p.busbw_gbps) for p in results.points if p.op == op)
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", ms=3, color=color,
                        label=f"{bundle_label(bundle.path.name)} ({results.ranks} "
                              f"{results.backend})")
        ax.set_xscale("log", base=2)
        ax.set_title(op, fontsize=9)
        ax.set_xlabel("message size S (bytes)", fontsize=8)
        ax.grid(alpha=0.3, lw=0.5)
    axes[0].set_ylabel("busbw (GB/s)")
    axes[0].legend(fontsize=7, frameon=False)
    fig.suptitle("Fabric: bus bandwidth as nccl-tests defines it", fontsize=10)
    return fig
