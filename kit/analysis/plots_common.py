"""What every figure of the report shares: rendering, colours, the time axis, status marks.

Figures are built with ``matplotlib.figure.Figure`` directly (no pyplot), so drawing never
touches a global backend or opens a window; :func:`png_bytes` renders one with Agg.

**Time axis.** Seconds from the first step. Warmup steps (the first one compiles and fills
caches, and can take most of a short run) are shown but compressed: when they would take more
than a quarter of the axis they get a fifth of it, with a marked boundary, so the measured
steps fill the rest. Step windows are shaded, warmup orange and measured alternating greys.
"""

import io
import textwrap
from collections import OrderedDict
from typing import Any, ClassVar

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, MaxNLocator

from kit.analysis.run_view import RunView, TimeAxis
from kit.metrics.attribution import MEASURED
from kit.metrics.text import shorten

DPI = 110
WARMUP_SHARE = 0.2
"""Share of the time axis that compressed warmup steps take."""
STATUS_COLOR = "#a00000"


class _SharedRendererCanvas(FigureCanvasAgg):
    """An Agg canvas that draws with this process's renderer of its size, not a new one.

    Matplotlib caches the measured extent of each text per renderer; a new renderer per figure
    (Agg's default) measured every tick label, legend entry and title again in each of a
    report's figures, most of which share their texts and sizes. A renderer is cleared before
    each draw, so sharing one leaves nothing of the last figure.
    """

    _renderers: ClassVar[OrderedDict[tuple[int, int, float], RendererAgg]] = OrderedDict()
    _KEEP = 8
    """Renderers kept (least recently used dropped): one per figure size, a few MB each."""

    def get_renderer(self) -> RendererAgg:
        """This process's renderer of the figure's size and dpi (made on first use)."""
        w, h = self.get_width_height(physical=True)
        key = (w, h, self.figure.dpi)
        renderers = self._renderers
        if key not in renderers:
            renderers[key] = RendererAgg(w, h, self.figure.dpi)
            while len(renderers) > self._KEEP:
                renderers.popitem(last=False)
        renderers.move_to_end(key)
        self.renderer = renderers[key]
        return self.renderer


def png_bytes(fig: Figure) -> bytes:
    """Render ``fig`` to PNG with the Agg backend, drawing it once.

    zlib level 1 instead of Pillow's 6: a report of 100 bundles saves some 400 figures, and
    encoding at level 6 took 10-25% of each save (measured on a busy 2-core host) for files only
    ~9% smaller.
    """
    _SharedRendererCanvas(fig)
    engine = fig.get_layout_engine()
    if engine is not None:
        # lay out, then save without the engine: savefig would draw the whole figure with
        # rendering disabled just to run the engine, then draw it again (for a 100-bundle
        # report's figures across configurations, about a third of their time)
        fig.set_dpi(DPI)  # as savefig would
        engine.execute(fig)
        fig.set_layout_engine("none")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, pil_kwargs={"compress_level": 1})
    return buf.getvalue()


def colors(n: int) -> list[Any]:
    """``n`` distinguishable colours (tab10, else spread over viridis)."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "viridis"]
    return [cmap(i if n <= 10 else i / max(n - 1, 1)) for i in range(n)]


def category_colors() -> dict[str, Any]:
    """One colour per kernel category (compute, collective, idle) for every figure of a report,
    so MatMul is the same colour in each; idle is grey."""
    from matplotlib import colormaps

    from kit.metrics.kernels import COLLECTIVES, COMPUTE, IDLE

    cmap = colormaps["tab20"]  # its strong colours first, then their light pairs; no greys
    order = [i for i in (*range(0, 20, 2), *range(1, 20, 2)) if i not in (14, 15)]
    palette: dict[str, Any] = {cat: cmap(order[i])
                               for i, cat in enumerate((*COMPUTE, *COLLECTIVES))}
    palette[IDLE] = (0.8, 0.8, 0.8, 1.0)
    return palette


def percent_axis(axis: Any) -> None:
    """Ticks of shares (0..1) as percentages with as many decimals as the range needs, so a
    0-1.3% axis reads 0.0%, 0.2%, ... rather than 0%, 0%, 1%, 1%."""
    from matplotlib.ticker import PercentFormatter

    axis.set_major_formatter(PercentFormatter(xmax=1.0))


def warmup_factor(axis: TimeAxis) -> float | None:
    """How much the warmup part of the axis is squeezed (0..1), or None when it is not."""
    if axis.measured is None:
        return None
    m0 = axis.measured[0]
    warm, rest = m0 - axis.lo, axis.hi - m0
    if warm <= 0 or rest <= 0 or warm <= 0.25 * (warm + rest):
        return None
    return WARMUP_SHARE / (1 - WARMUP_SHARE) * rest / warm


def set_time_axis(ax: Any, axis: TimeAxis) -> None:
    """Limits, the warmup compression (a piecewise-linear scale) and ticks of a time axis."""
    k = warmup_factor(axis)
    ax.set_xlim(axis.lo, axis.hi)
    if k is None or axis.measured is None:
        return
    m0 = axis.measured[0]

    def forward(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, float)
        return np.where(x < m0, m0 + (x - m0) * k, x)

    def inverse(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, float)
        return np.where(x < m0, m0 + (x - m0) / k, x)

    ax.set_xscale("function", functions=(forward, inverse))
    ax.set_xlim(axis.lo, axis.hi)
    rest = MaxNLocator(6).tick_values(m0, axis.hi)
    rest = [t for t in rest if m0 <= t <= axis.hi]
    step = rest[1] - rest[0] if len(rest) > 1 else axis.hi - m0
    warm = [t for t in MaxNLocator(3).tick_values(axis.lo, m0)
            if axis.lo <= t <= m0 - 0.5 * step / k]  # clear of the first measured tick
    ax.xaxis.set_major_locator(FixedLocator([*warm, *rest]))
    ax.axvline(m0, color="0.3", lw=0.8, ls=":")


def time_label(axis: TimeAxis) -> str:
    """The time axis label: from what, and how much the warmup part is compressed."""
    label = ("time from first step (s)" if len(axis.windows.start)
             else "time from first sample (s)")
    k = warmup_factor(axis)
    return label if k is None else f"{label}; left of the dotted line compressed {1 / k:.0f}x"


def mark_steps(ax: Any, axis: TimeAxis, band: tuple[float, float] | None = None) -> None:
    """Shade each step window: warmup orange, measured alternating greys; the axes' full
    height, or ``band`` (data y from, to) when the axes holds several runs.

    One collection for all windows: a patch per window (``axvspan``) cost a 100-bundle report
    about a fifth of its figure time (each patch transformed and drawn on its own, through the
    warmup-compressing scale).
    """
    from matplotlib.collections import PolyCollection

    measured = warmup = 0
    spans, fill = [], []
    for start, end, phase in zip(axis.windows.start - axis.t0, axis.windows.end - axis.t0,
                                 axis.windows.phase, strict=True):
        if phase == MEASURED:
            fill.append(("0.80", "0.90")[measured % 2])
            measured += 1
        else:
            fill.append(("#f6c88f", "#fadcb5")[warmup % 2])
            warmup += 1
        lo, hi = band or (0, 1)
        spans.append([(start, lo), (start, hi), (end, hi), (end, lo)])
    if spans:
        ax.add_collection(PolyCollection(spans, facecolors=fill, alpha=0.6, lw=0, zorder=0,
                                         transform=ax.transData if band else
                                         ax.get_xaxis_transform()), autolim=False)


def step_handles(axis: TimeAxis) -> tuple[list[Any], list[str]]:
    """Legend entries for the step shading (none when no step ran)."""
    from matplotlib.patches import Patch

    if not len(axis.windows.start):
        return [], []
    return ([Patch(color="#f6c88f", alpha=0.6), Patch(color="0.80", alpha=0.6)],
            ["warmup step", "measured step"])


def legend_outside(ax: Any, handles: list[Any], labels: list[str], title: str | None = None,
                   ncol: int = 1) -> None:
    """A legend right of the axes, never over the data."""
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
              frameon=False, title=title, title_fontsize=7, ncol=ncol, borderaxespad=0)


def share_bars(ax: Any, rows: list[tuple[str, dict[str, float]]], cats: list[str],
               palette: dict[str, Any], xlabel: str, hatched: frozenset[str] = frozenset(),
               ) -> None:
    """One stacked horizontal bar of shares (0..1) per row, top to bottom, ``cats`` in order;
    a segment of 6% or more says its share, ``hatched`` categories are hatched; the legend
    sits right of the axes."""
    for i, (_, shares) in enumerate(rows):
        left = 0.0
        for cat in cats:
            share = shares.get(cat, 0.0)
            if share <= 0:
                continue
            ax.barh(i, share, left=left, color=palette[cat], height=0.65,
                    hatch="//" if cat in hatched else None, edgecolor="white", lw=0.3,
                    label=cat if cat not in ax.get_legend_handles_labels()[1] else None)
            if share >= 0.06:
                ax.text(left + share / 2, i, f"{share:.0%}", ha="center", va="center",
                        fontsize=7)
            left += share
    ax.set_yticks(range(len(rows)), [name for name, _ in rows], fontsize=7.5)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    ax.set_xlabel(xlabel)
    handles, labels = ax.get_legend_handles_labels()
    legend_outside(ax, handles, labels)


def row_names(axes: Any, names: list[str], fontsize: float, top: float = -0.5) -> None:
    """One row per name, top-down, across panels side by side: the names on the first panel,
    none (and no y ticks) on the others.

    Instead of a shared y axis, which gives every panel a tick per row to build, place and lay
    out: with 50 configurations that was most of a figure's time.
    """
    axes[0].set_yticks(range(len(names)), names, fontsize=fontsize)
    for ax in axes:
        ax.set_ylim(len(names) - 0.5, top)
    for ax in axes[1:]:
        ax.set_yticks([])


def status_line(view: RunView) -> str | None:
    """What a figure of a run that did not end ok says first, or None for an ok run."""
    m = view.bundle.manifest
    if m.status == "ok":
        return None
    steps = len(view.axis.windows.start) if view.axis else 0
    ran = (f"{steps} step{'s' if steps != 1 else ''} ran" if steps
           else "no step ran: the whole record is shown")
    error = shorten((m.error or "no error recorded").splitlines()[0], 110)
    return f"{m.status.upper()}: {ran}; {error}"


TITLE_PT = 9.5
"""Font size of figure titles."""


def wrapped(lines: list[str], width_in: float, fontsize: float = TITLE_PT) -> list[str]:
    """``lines`` broken between words to fit ``width_in`` inches of text at ``fontsize``
    (a character is taken as 0.55 em wide), so no title runs past the figure's edge."""
    chars = max(20, int(width_in * 72 / (fontsize * 0.55)))
    return [part for line in lines for part in textwrap.wrap(line, chars) or [""]]


def title(fig: Figure, text: str, view: RunView) -> int:
    """A figure title: what it shows, the run, its sample period, its status when not ok,
    wrapped to the figure's width; returns its number of lines."""
    status = status_line(view)
    lines = wrapped([*([status] if status else []), text,
                     f"{view.bundle.path.name} · {view.period_text()}"],
                    fig.get_figwidth() - 0.4)
    fig.suptitle("\n".join(lines), fontsize=TITLE_PT, color=STATUS_COLOR if status else "black")
    return len(lines)


def place_axes(fig: Figure, left: float, right: float, top: float, bottom: float,
               gap: float = 0.3) -> None:
    """Margins in inches around the axes (``gap`` between rows and columns), set without a
    layout engine: a layout engine needs a draw of its own before saving, which doubles the
    cost of every figure (:mod:`kit.analysis.figure_render`)."""
    w, h = fig.get_size_inches()
    grid = next((ax.get_subplotspec().get_gridspec() for ax in fig.axes
                 if ax.get_subplotspec() is not None), None)
    rows, cols = grid.get_geometry() if grid is not None else (1, 1)
    height = max(h - top - bottom - gap * (rows - 1), 0.5) / rows
    width = max(w - left - right - gap * (cols - 1), 0.5) / cols
    fig.subplots_adjust(left=left / w, right=1 - right / w, top=1 - top / h, bottom=bottom / h,
                        hspace=gap / height, wspace=gap / width)


def legend_width(labels: list[str], fontsize: float = 7) -> float:
    """Inches a legend of ``labels`` outside the axes takes (handle, text, padding)."""
    longest = max((len(line) for label in labels for line in label.splitlines()), default=0)
    return 0.55 + longest * fontsize * 0.55 / 72


def legends_width(fig: Figure) -> float:
    """Inches the widest legend placed right of the axes (:func:`legend_outside`) takes; 0
    without one."""
    widths = []
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is not None:
            labels = [t.get_text() for t in legend.get_texts()]
            labels += [legend.get_title().get_text()]
            cols = max(getattr(legend, "_ncols", 1), 1)
            widths.append(legend_width(labels) * cols)
    return max(widths, default=0.0)


def label_width(labels: list[str], fontsize: float) -> float:
    """Inches the longest line of ``labels`` takes at ``fontsize`` (tick labels)."""
    longest = max((len(line) for label in labels for line in label.splitlines()), default=0)
    return longest * fontsize * 0.55 / 72


def title_height(lines: int) -> float:
    """Inches a suptitle of ``lines`` lines takes above the axes."""
    return 0.2 + lines * TITLE_PT * 1.35 / 72
