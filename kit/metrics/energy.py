"""One device's energy over the measured steps, from its counter and its power samples.

The hardware energy counter is read far less often than the steps last (NVML's refreshes about
every 100 ms and the sampler reads it every 100-400 ms; a gpt3-1.3b step on four H200s lasts
0.18 s), so its readings rarely fall on a step's edges. The counter's value at any time ``t``
is therefore estimated between the two readings that bracket ``t``, and the measured energy is
the sum, over measured step windows, of the estimate at the window's end minus the estimate at
its start: whatever the counter's period relative to the step, every joule between two
readings is shared out, none dropped (the gaps between measured steps, microseconds, are left
out by the same interpolation).

Between two readings the rise is shared out in proportion to the integral of the device's
power samples (the 20 ms instantaneous power) when there are any in that interval, so a
window that covers the busy half of a counter interval gets the busy half's energy; without
power samples, in proportion to time. A window edge before the first reading or after the last
(the sampler stops before the run ends, or started late) takes the power integral from the
nearest reading, scaled by the counter's own ratio to that integral; without power samples it
cannot be known and the device's counter energy is None (never 0). ``counter_coverage`` says
which share of the measured time the readings bracket.

The power integral runs through the power samples by the trapezoid rule, linearly inside each
interval between two samples (at that interval's mean power), so its value at a window edge
or a counter reading needs no sample there. It is returned as the first cross-check: the counter
and the integral measure the same energy two ways.
"""

from typing import NamedTuple

import numpy as np

from kit.metrics.attribution import StepWindows


class DeviceEnergy(NamedTuple):
    """A device's energy over the measured windows, and what it rests on."""

    counter_j: float | None
    """The counter's rise over the measured windows (None: fewer than two readings, or an
    edge outside them with no power samples to carry it)."""
    integral_j: float | None
    """Trapezoidal integral of the power samples over the windows (None: no samples that
    bracket them)."""
    counter_readings: int
    """Counter readings used: those inside the measured span and the two that bracket it."""
    counter_coverage: float | None
    """Share of the measured time that lies between the first and last counter reading."""
    span_counter_j: float | None = None
    """The counter's rise from the first measured step's start to the last one's end, the gaps
    between steps included: what a window around the whole measured phase (Zeus's) reads."""


def _cumulative(t: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Trapezoidal running integral of ``p`` over ``t``, 0 at the first sample."""
    out = np.zeros(len(t))
    if len(t) > 1:
        out[1:] = np.cumsum(np.diff(t) * (p[1:] + p[:-1]) / 2)
    return out


def _bracketed(t: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Whether each edge lies within ``[t[0], t[-1]]``."""
    return (edges >= t[0]) & (edges <= t[-1]) if len(t) else np.zeros(len(edges), bool)


def _integral_at(tp: np.ndarray, cum: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The power integral at times ``at`` (linear in between samples, NaN outside them)."""
    out = np.interp(at, tp, cum) if len(tp) else np.full(len(at), np.nan)
    out[~_bracketed(tp, at)] = np.nan
    return out


def _counter_at(tc: np.ndarray, e: np.ndarray, tp: np.ndarray, cum: np.ndarray,
                at: np.ndarray) -> np.ndarray:
    """The counter's estimated value at times ``at`` (module docstring); NaN where unknown."""
    k = np.clip(np.searchsorted(tc, at, side="right") - 1, 0, len(tc) - 2)
    t0, t1, e0, e1 = tc[k], tc[k + 1], e[k], e[k + 1]
    share = np.clip((at - t0) / (t1 - t0), 0.0, 1.0)
    pi_at, pi0, pi1 = (_integral_at(tp, cum, x) for x in (at, t0, t1))
    by_power = np.isfinite(pi_at) & np.isfinite(pi0) & np.isfinite(pi1) & (pi1 > pi0)
    share = np.where(by_power, np.clip((pi_at - pi0) / np.where(by_power, pi1 - pi0, 1.0),
                                       0.0, 1.0), share)
    value = e0 + (e1 - e0) * share
    outside = ~_bracketed(tc, at)
    if outside.any():
        # Carried from the nearest reading by the power integral, at the counter's own scale.
        span = _integral_at(tp, cum, tc[[0, -1]])
        scale = ((e[-1] - e[0]) / (span[1] - span[0])
                 if np.all(np.isfinite(span)) and span[1] > span[0] else 1.0)
        near = np.where(at < tc[0], 0, len(tc) - 1)
        pi_near = _integral_at(tp, cum, tc[near])
        value[outside] = (e[near] + scale * (pi_at - pi_near))[outside]
    return value


def device_energy(windows: StepWindows, measured: np.ndarray, t: np.ndarray,
                  counter: np.ndarray, power: np.ndarray) -> DeviceEnergy:
    """The device's energy over the measured windows, by counter and by power integral.

    Args:
        windows: Every step's window (:func:`kit.metrics.attribution.step_windows`).
        measured: Which of ``windows`` are measured.
        t: Times of all the device's rows, in order (not only those inside measured windows).
        counter: The cumulative energy counter at each row, joules; NaN where not read.
        power: Power at each row, watts; NaN where not read.
    """
    start, end = windows.start[measured], windows.end[measured]
    if not len(start):
        return DeviceEnergy(None, None, 0, None)
    has_p = ~np.isnan(power)
    tp, pp = t[has_p], power[has_p]
    cum = _cumulative(tp, pp)
    pi = _integral_at(tp, cum, np.r_[start, end])
    integral = (float(np.sum(pi[len(start):] - pi[:len(start)]))
                if len(tp) > 1 and np.all(np.isfinite(pi)) else None)
    has_e = ~np.isnan(counter)
    tc, e = t[has_e], counter[has_e]
    if len(tc) > 1:  # readings at one time (a row per lane) count once
        keep = np.r_[True, np.diff(tc) > 0]
        tc, e = tc[keep], e[keep]
    lo, hi = float(start.min()), float(end.max())
    inside = int(np.count_nonzero((tc >= lo) & (tc <= hi)))
    readings = inside + int(np.any(tc < lo)) + int(np.any(tc > hi))
    if len(tc) < 2:
        return DeviceEnergy(None, integral, readings, 0.0 if len(tc) else None)
    covered = np.clip(np.minimum(end, tc[-1]) - np.maximum(start, tc[0]), 0.0, None)
    coverage = float(covered.sum() / max(float(np.sum(end - start)), 1e-12))
    value = _counter_at(tc, e, tp, cum, np.r_[start, end, lo, hi])
    n = len(start)
    energy = (float(np.sum(value[n:2 * n] - value[:n]))
              if np.all(np.isfinite(value[:2 * n])) else None)
    span = float(value[-1] - value[-2]) if np.all(np.isfinite(value[-2:])) else None
    return DeviceEnergy(energy, integral, readings, coverage, span)
