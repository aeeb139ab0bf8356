"""One figure per shape, drawn again for each run: a report's per-run timelines reuse it.

A report of 100 bundles draws the same two timeline figures (power and temperature; SM clock and
throttle reasons) 100 times each, and building a figure's axes and their ticks anew each time
was a quarter of their cost. Inside :func:`reusing` (one figure job at a time, as the report's
workers draw them), :func:`figure_and_axes` hands back the figure of that size and layout made
before, its axes emptied of data, titles, labels, legend, scales and locators, so that what is
drawn next looks as on a new figure (the report's 100 bundles render to identical pixels either
way). Outside it, each call makes a new figure, which callers may keep.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import AutoLocator, ScalarFormatter

_kept: dict[tuple[Any, ...], tuple[Figure, Any]] = {}
"""This process's reusable figures by shape (a few: one per timeline layout)."""
_active = False
"""Whether :func:`reusing` is active."""


@contextmanager
def reusing() -> Iterator[None]:
    """Reuse figures of one shape within the block; the caller draws (and renders) one figure
    at a time, so the figure handed out last is free again at the next call."""
    global _active
    outer, _active = _active, True
    try:
        yield
    finally:
        _active = outer


def _empty(ax: Any) -> None:
    """Remove what was drawn on ``ax`` and reset what a timeline sets, keeping its ticks."""
    for artist in [*ax.lines, *ax.collections, *ax.patches, *ax.texts, *ax.images]:
        artist.remove()
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    ax.set_xscale("linear")
    ax.set_yscale("linear")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(AutoLocator())
        axis.set_major_formatter(ScalarFormatter())
        axis.isDefault_majloc = axis.isDefault_majfmt = True
    ax.set_title("")
    ax.set_xlabel("")
    ax.set_ylabel("")
    ax.grid(False)
    ax.relim()
    ax.ignore_existing_data_limits = True
    ax.autoscale(True)


def figure_and_axes(figsize: tuple[float, float], nrows: int, ncols: int,
                    **subplots: Any) -> tuple[Figure, Any]:
    """A figure of ``figsize`` and its ``nrows`` x ``ncols`` axes (``Figure.subplots``
    keywords): a new one, or inside :func:`reusing` the one of this shape made before,
    emptied."""
    key = (tuple(figsize), nrows, ncols, repr(sorted(subplots.items())))
    if _active and key in _kept:
        fig, axes = _kept[key]
        for ax in np.ravel(axes):
            _empty(ax)
        fig.suptitle("")
        return fig, axes
    fig = Figure(figsize=figsize)
    axes = fig.subplots(nrows, ncols, **subplots)
    if _active:
        _kept[key] = (fig, axes)
    return fig, axes
