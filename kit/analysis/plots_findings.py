"""A study finding's figure, drawn only where its verdict rests on it.

The data come from a finding's :class:`kit.study.verdicts.Plot` (read here through
:class:`FindingPlot`, so that the figures stay below the study): one line or bar group per
series. What the figure may say is held to what the verdict holds:

* Under a verdict that is no evidence either way (:data:`NOT_EVIDENCE`: ``not measurable
  here``, ``confounded``) there is no figure: a plot titled with the study's claim would read
  as support or refutation of it; the verdict's reason says what was measured instead.
* The quantity axis starts at zero (a bar or line that starts elsewhere shows a difference
  larger than it is), unless the plot names another origin (``y_origin``, e.g. 1 for a
  peak-to-mean ratio) or none (``y_origin = None``: the axis fits the data), and the axis label
  then says so.
* Sample counts, when the plot carries them (``samples``: series name -> how many samples or
  runs it rests on, or one count per point), are given in the legend as ``n=`` (a range where
  its points differ).
* A value a series lacks is left out, never drawn as a zero bar.
"""

from collections.abc import Mapping
from typing import Any, Protocol

from matplotlib.figure import Figure

from kit.analysis.plots_common import colors

NOT_EVIDENCE = frozenset({"not measurable here", "confounded"})
"""Verdicts whose runs neither support nor refute the finding: no figure stands under them."""


class FindingPlot(Protocol):
    """What a finding's figure is drawn from (:class:`kit.study.verdicts.Plot`). Optional,
    read when present: ``samples`` (series name -> a count, or one per point) and ``y_origin``
    (float or None)."""

    kind: str
    """``line`` or ``bar``."""
    x_label: str
    y_label: str
    series: Mapping[str, list[tuple[Any, float]]]


def is_evidence(verdict: str) -> bool:
    """Whether a figure may stand under ``verdict`` (not in :data:`NOT_EVIDENCE`)."""
    return verdict not in NOT_EVIDENCE


def _label(plot: FindingPlot, name: str) -> str:
    """A series' legend entry, with its sample count when the plot has one: one count for the
    series, or one per point (``n=LOW-HIGH`` when they differ; unknown points left out)."""
    n = (getattr(plot, "samples", None) or {}).get(name)
    counts = [c for c in (n if isinstance(n, (list, tuple)) else [n]) if c is not None]
    if not counts:
        return name
    low, high = min(counts), max(counts)
    return f"{name} (n={low})" if low == high else f"{name} (n={low}-{high})"


def _origin_label(plot: FindingPlot) -> tuple[float | None, str]:
    """Where the quantity axis starts (None: fitted to the data) and its label."""
    origin = getattr(plot, "y_origin", 0.0)
    if origin is None:
        return None, f"{plot.y_label} (axis not from zero)"
    return float(origin), plot.y_label if origin == 0 else f"{plot.y_label} (axis from {origin:g})"


def _known(points: list[tuple[Any, float | None]]) -> list[tuple[Any, float]]:
    return [(x, float(y)) for x, y in points if y is not None]


def finding_figure(plot: FindingPlot, title: str, verdict: str) -> Figure | None:
    """The figure of a finding with verdict ``verdict``, titled ``title`` (the finding's);
    None under a verdict that is no evidence (:data:`NOT_EVIDENCE`) or when no series has a
    value. A caller writing the study's figures (kit.study.render) draws with this."""
    series = {name: _known(points) for name, points in plot.series.items()}
    if not is_evidence(verdict) or not any(series.values()):
        return None
    fig = Figure(figsize=(6.4, 3.8), layout="constrained")
    ax = fig.add_subplot()
    palette = colors(len(series))
    if plot.kind == "line":
        for (name, points), color in zip(series.items(), palette, strict=True):
            if points:
                ax.plot([x for x, _ in points], [y for _, y in points], marker="o",
                        label=_label(plot, name), color=color)
    else:
        cats = list(dict.fromkeys(str(x) for points in series.values() for x, _ in points))
        width = 0.8 / max(len(series), 1)
        for i, ((name, points), color) in enumerate(zip(series.items(), palette, strict=True)):
            at = [(cats.index(str(x)) + i * width, y) for x, y in points]
            ax.bar([x for x, _ in at], [y for _, y in at], width, label=_label(plot, name),
                   color=color)
        ax.set_xticks([c + width * (len(series) - 1) / 2 for c in range(len(cats))],
                      cats, rotation=20, ha="right", fontsize=8)
        ax.axhline(0, color="0.3", lw=0.8)
    origin, y_label = _origin_label(plot)
    if origin is not None:
        values = [y for points in series.values() for _, y in points]
        low, high = min(values + [origin]), max(values + [origin])
        pad = 0.05 * (high - low or abs(high) or 1.0)
        ax.set_ylim(low - pad if low < origin else origin, high + pad)
    ax.set_xlabel(plot.x_label)
    ax.set_ylabel(y_label)
    ax.set_title(f"{title}\nthis node: {verdict}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig
