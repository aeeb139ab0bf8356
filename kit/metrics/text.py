"""Text for people: values as tables print them, and messages shortened without cutting a word.

The numbers of the kit's tables: ``fmt`` for run summaries and sweeps, ``format_value`` for
compare, ranking and projections (fractions as percent), both ``n/a`` for a value not
measurable here.
"""

from typing import Any

ELLIPSIS = "..."
"""Marks text left out; ASCII, so any terminal, CSV reader or log prints it."""


def shorten(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, cut at a word boundary and ending in ``...``.

    A cut mid-word reads as a different word (``connection refu``) or hides the useful end of a
    path. When the text has no space in the second half of its first ``width`` characters (one
    long path or token), it is cut there anyway rather than dropping nearly all of it.
    """
    if len(text) <= width:
        return text
    room = text[:width - len(ELLIPSIS) + 1]  # one more: is the cut right before a space?
    cut = room.rfind(" ")
    if cut < width // 2:
        cut = width - len(ELLIPSIS)
    return text[:cut].rstrip() + ELLIPSIS


NA = "n/a"
"""A value that is not measurable here (None)."""


def format_value(value: float | None, unit: str) -> str:
    """One value for people: fractions as percent, 4 significant digits, ``n/a`` for None."""
    if value is None:
        return NA
    if unit == "fraction":
        return f"{value * 100:.1f}%"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def fmt(value: Any, unit: str = "", digits: int = 3) -> str:
    """Format a metric; ``None`` (not measurable here) becomes ``n/a``."""
    if value is None:
        return NA
    if isinstance(value, float):
        return f"{value:.{digits}g}{unit}"
    return f"{value}{unit}"
