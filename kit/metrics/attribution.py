"""Attribute telemetry samples to training steps and phases.

A step's window is the closed interval from the earliest rank's ``t_start`` to the latest
rank's ``t_end``. A sample inside a window takes that step and the step's phase (``warmup`` or
``measured``); a sample outside every window (before the first step, in the gaps between
steps, after the last) is ``idle`` with a null step. Where two windows overlap (clock skew
between nodes) or touch, a sample in both belongs to the later-starting step.

Attribution sorts the windows once and binary-searches every sample time among their bounds:
O((n + s) log s) for n samples and s steps, vectorized.
"""

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PHASES: tuple[str, ...] = ("warmup", "measured", "idle")
"""Phase names; a phase code is the index into this tuple."""

WARMUP, MEASURED, IDLE = range(len(PHASES))


class StepWindows(NamedTuple):
    """One entry per step, sorted by window start."""

    step: np.ndarray
    """Step index (int32)."""
    start: np.ndarray
    """Earliest ``t_start`` over ranks, unix seconds."""
    end: np.ndarray
    """Latest ``t_end`` over ranks, unix seconds."""
    phase: np.ndarray
    """Phase code (int8): :data:`WARMUP` or :data:`MEASURED`."""


def step_windows(steps: pa.Table) -> StepWindows:
    """Collapse ``steps.parquet`` rows (one per step per rank) into one window per step.

    Args:
        steps: Rows of :data:`kit.bundle.schema.STEPS_SCHEMA`.

    Returns:
        The windows, sorted by start. A step's phase is its first row's.
    """
    step = steps["step"].to_numpy().astype(np.int32)
    if len(step) == 0:
        empty = np.empty(0)
        return StepWindows(step, empty, empty, np.empty(0, np.int8))
    order = np.argsort(step, kind="stable")
    step = step[order]
    first = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    start = np.minimum.reduceat(steps["t_start"].to_numpy()[order], first)
    end = np.maximum.reduceat(steps["t_end"].to_numpy()[order], first)
    measured = pc.equal(steps["phase"], "measured").to_numpy()[order][first]
    phase = np.where(measured, MEASURED, WARMUP).astype(np.int8)
    by_start = np.argsort(start, kind="stable")
    return StepWindows(step[first][by_start], start[by_start], end[by_start], phase[by_start])


def window_index(t: np.ndarray, windows: StepWindows) -> np.ndarray:
    """Position in ``windows`` of each sample's window, -1 outside every window.

    One binary search over the interleaved window bounds: a window is made half-open just past
    its end and cut at the next window's start, so the bounds are sorted and a sample lies in a
    window exactly when an odd number of bounds are at or before it.

    Args:
        t: Sample times, unix seconds, in any order.
        windows: From :func:`step_windows`.

    Returns:
        int64 indices into the fields of ``windows``.
    """
    stop = np.nextafter(windows.end, np.inf)
    stop[:-1] = np.minimum(stop[:-1], windows.start[1:])
    bounds = np.empty(2 * len(stop))
    bounds[0::2], bounds[1::2] = windows.start, np.maximum(stop, windows.start)
    pos = np.searchsorted(bounds, t, side="right")
    inside = np.bitwise_and(pos, 1, dtype=np.int8).view(bool)  # odd; int8 keeps memory low
    pos >>= 1
    pos[~inside] = -1
    return pos


def attribute_samples(telemetry: pa.Table, steps: pa.Table) -> pa.Table:
    """Add each telemetry row's ``step`` and ``phase``.

    Args:
        telemetry: Rows of :data:`kit.bundle.schema.TELEMETRY_SCHEMA` (GPU and host rows).
        steps: Rows of :data:`kit.bundle.schema.STEPS_SCHEMA`.

    Returns:
        ``telemetry`` with two more columns: ``step`` (int32, null outside every step window)
        and ``phase`` (string: ``warmup``, ``measured`` or ``idle``).
    """
    windows = step_windows(steps)
    k = window_index(telemetry["t"].to_numpy(), windows)
    step = np.r_[windows.step, np.int32(-1)][k]  # k = -1 picks the appended entry
    phase = np.r_[windows.phase, np.int8(IDLE)][k]
    return telemetry.append_column(
        pa.field("step", pa.int32()), pa.array(step, mask=step < 0)
    ).append_column(pa.field("phase", pa.string()), pa.array(PHASES).take(pa.array(phase)))
