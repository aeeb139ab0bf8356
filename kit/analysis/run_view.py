"""A bundle's telemetry made ready to draw, and the scales several bundles' figures share.

Every bundle gets a view, whatever its status: a failed run's samples up to the crash are what
its investigation needs. The time axis starts at the first step (seconds from it), or at the
first sample when no step ran; it shows the steps with :data:`PAD_S` on either side, and for a
run that did not end ok every sample up to the last. The *focus* of per-device figures is the
measured steps; a run without measured steps falls back to its warmup steps, then to its whole
record, and says which (:attr:`RunView.scope`).

:class:`Scales` are the y ranges and colour ranges of all views together, so figures of
different runs can be read against each other.
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kit.bundle.reader import Bundle
from kit.metrics.attribution import MEASURED, WARMUP, StepWindows, step_windows, window_index
from kit.metrics.labels import DeviceRole, device_roles

PAD_S = 2.0
"""Seconds of telemetry shown before the first step and after the last."""


class DeviceSeries(NamedTuple):
    """One device's samples of one field, time in seconds from the axis origin."""

    node: int
    device: int
    t: np.ndarray
    value: np.ndarray


@dataclass(frozen=True)
class TimeAxis:
    """Where a run's time axis starts and what it shows (seconds from ``t0``)."""

    t0: float
    """Unix seconds at 0: the first step's start, else the first sample."""
    lo: float
    hi: float
    windows: StepWindows
    """Step windows, unix seconds."""
    measured: tuple[float, float] | None
    """First measured step's start and last one's end, from ``t0``; None without one."""


@dataclass(frozen=True)
class DeviceStats:
    """One device over the view's focus: mean and extreme of each quantity (None: not measured)."""

    power_mean: float | None
    power_max: float | None
    temp_mean: float | None
    temp_max: float | None
    clock_mean: float | None
    clock_min: float | None
    link_gbps: float | None
    """NVLink/xGMI bytes sent and received per second, GB/s (1e9), from the counters."""


@dataclass(frozen=True)
class RunView:
    """What the figures of one bundle draw."""

    bundle: Bundle
    axis: TimeAxis | None
    """None when the bundle has neither steps nor telemetry."""
    power: list[DeviceSeries]
    """GPU board power per device; host RAPL power per node when no GPU has power."""
    power_kind: str
    """``board`` or ``CPU package``."""
    temp: list[DeviceSeries]
    clock: list[DeviceSeries]
    throttle: list[DeviceSeries]
    roles: list[DeviceRole]
    """Every GPU with samples, in node and device order."""
    stats: dict[tuple[int, int], DeviceStats]
    scope: str
    """What ``stats`` cover: ``measured steps``, ``warmup steps`` or ``whole record``."""
    power_limits_w: list[float]
    clock_max_mhz: list[float]
    period_ms: float | None
    """The recorded sample period (manifest telemetry_sources), else the samples' median gap."""
    asked_ms: int | None
    """The period the run asked for (--telemetry-interval-ms)."""

    def role(self, node: int, device: int) -> DeviceRole | None:
        """The role of one device, if it has samples."""
        return next((r for r in self.roles if (r.node, r.device) == (node, device)), None)

    def period_text(self) -> str:
        """``samples every 114 ms (asked 20 ms)``, or what is known of it."""
        if self.period_ms is None:
            return "sample period unknown"
        text = f"samples every {self.period_ms:.0f} ms"
        if self.asked_ms and abs(self.period_ms - self.asked_ms) > 0.1 * self.asked_ms:
            text += f" (asked {self.asked_ms} ms)"
        return text


def _rows(telemetry: pa.Table, source: str, field: str) -> pa.Table:
    return telemetry.filter(pc.and_(pc.equal(telemetry["source"], source),
                                    pc.is_valid(telemetry[field])))


def _pairs(node: np.ndarray, dev: np.ndarray) -> list[tuple[int, int]]:
    """The distinct (node, device) pairs of the rows, sorted (numpy: a set of Python tuples
    over every sample took a 100-bundle report a few seconds, and ``np.unique(axis=0)`` of
    the pairs, sorting them as records, half of every bundle's view; one int64 key each is
    sorted as numbers)."""
    if not len(node):
        return []
    key = np.asarray(node, np.int64) * (1 << 32) + (np.asarray(dev, np.int64) + 1)
    return [(int(k >> 32), int(k & 0xFFFFFFFF) - 1) for k in np.unique(key)]


def series(telemetry: pa.Table, source: str, field: str, t0: float) -> list[DeviceSeries]:
    """Per device (host rows: per node, device -1), the non-null samples of ``field`` in time
    order.
    """
    rows = _rows(telemetry, source, field)
    if rows.num_rows == 0:
        return []
    node = rows["node"].to_numpy()
    dev = (rows["device"].to_numpy(zero_copy_only=False) if source == "gpu"
           else np.full(rows.num_rows, -1))
    t = rows["t"].to_numpy() - t0
    value = rows[field].to_numpy(zero_copy_only=False).astype(float)
    out = []
    for n, d in _pairs(node, dev):
        pick = np.flatnonzero((node == n) & (dev == d))
        pick = pick[np.argsort(t[pick], kind="stable")]
        out.append(DeviceSeries(n, d, t[pick], value[pick]))
    return out


def _axis(bundle: Bundle) -> TimeAxis | None:
    windows = step_windows(bundle.steps)
    t = bundle.telemetry["t"].to_numpy()
    if len(windows.start) == 0 and len(t) == 0:
        return None
    if len(windows.start):
        t0 = float(windows.start.min())
        lo, hi = -PAD_S, float(windows.end.max()) - t0 + PAD_S
        if bundle.manifest.status != "ok" and len(t):
            hi = max(hi, float(t.max()) - t0)
    else:
        t0 = float(t.min())
        lo, hi = 0.0, max(float(t.max()) - t0, 1e-3)
    measured = windows.phase == MEASURED
    span = ((float(windows.start[measured].min()) - t0, float(windows.end[measured].max()) - t0)
            if measured.any() else None)
    return TimeAxis(t0, lo, hi, windows, span)


def _focus(t_abs: np.ndarray, windows: StepWindows, scope: str) -> np.ndarray:
    """Which samples the stats cover: those in windows of the scope's phase, or all."""
    if scope == "whole record":
        return np.ones(len(t_abs), bool)
    k = window_index(t_abs, windows)
    phase = np.r_[windows.phase, np.int8(-1)][k]
    return phase == (MEASURED if scope == "measured steps" else WARMUP)


def _scope(windows: StepWindows) -> str:
    if (windows.phase == MEASURED).any():
        return "measured steps"
    return "warmup steps" if len(windows.phase) else "whole record"


def _rate_gbps(t: np.ndarray, counter: np.ndarray) -> float | None:
    """Bytes per second of a cumulative counter over its samples, GB/s; None with fewer than
    two readings.
    """
    if len(t) < 2 or t[-1] <= t[0]:
        return None
    return float(counter[-1] - counter[0]) / float(t[-1] - t[0]) / 1e9


def _stats(bundle: Bundle, axis: TimeAxis, scope: str) -> dict[tuple[int, int], DeviceStats]:
    gpu = bundle.telemetry.filter(pc.equal(bundle.telemetry["source"], "gpu"))
    if gpu.num_rows == 0:
        return {}
    keep = _focus(gpu["t"].to_numpy(), axis.windows, scope)
    gpu = gpu.filter(pa.array(keep))
    node = gpu["node"].to_numpy()
    dev = gpu["device"].to_numpy(zero_copy_only=False)
    t = gpu["t"].to_numpy()

    def col(name: str) -> np.ndarray:
        return gpu[name].to_numpy(zero_copy_only=False).astype(float)  # null -> nan

    power, temp, clock = col("power_w"), col("temp_gpu_c"), col("clock_sm_mhz")
    link = col("link_tx_bytes") + col("link_rx_bytes")
    out = {}
    def agg(values: np.ndarray, pick: np.ndarray, how: str) -> float | None:
        known = values[pick & ~np.isnan(values)]
        return float(getattr(np, how)(known)) if len(known) else None

    for n, d in _pairs(node, dev):
        pick = (node == n) & (dev == d)
        has_link = pick & ~np.isnan(link)
        order = np.argsort(t[has_link], kind="stable")
        out[(n, d)] = DeviceStats(agg(power, pick, "mean"), agg(power, pick, "max"),
                                  agg(temp, pick, "mean"), agg(temp, pick, "max"),
                                  agg(clock, pick, "mean"), agg(clock, pick, "min"),
                                  _rate_gbps(t[has_link][order], link[has_link][order]))
    return out


def _period_ms(bundle: Bundle, power: list[DeviceSeries]) -> float | None:
    source = bundle.manifest.telemetry_sources.get("power_w")
    if source is not None and source.period_ms:
        return source.period_ms
    gaps = [np.diff(s.t) for s in power if len(s.t) > 1]
    return float(np.median(np.concatenate(gaps))) * 1e3 if gaps else None


def run_view(bundle: Bundle) -> RunView:
    """Everything the per-run and cross-run figures draw of ``bundle``."""
    axis = _axis(bundle)
    telemetry = bundle.telemetry
    t0 = axis.t0 if axis else 0.0
    power, kind = series(telemetry, "gpu", "power_w", t0), "board"
    if not power:  # a device with only the driver's average (e.g. MI250)
        power, kind = series(telemetry, "gpu", "power_avg_w", t0), "board, averaged"
    if not power:
        power, kind = series(telemetry, "host", "cpu_power_w", t0), "CPU package"
    scope = _scope(axis.windows) if axis else "whole record"
    stats = _stats(bundle, axis, scope) if axis else {}
    rows = _rows(telemetry, "gpu", "t")
    gpus = _pairs(rows["node"].to_numpy(zero_copy_only=False),
                  rows["device"].to_numpy(zero_copy_only=False))
    facts = [g for node in bundle.manifest.inventory for g in node.gpus]
    return RunView(
        bundle, axis, power, kind,
        series(telemetry, "gpu", "temp_gpu_c", t0), series(telemetry, "gpu", "clock_sm_mhz", t0),
        series(telemetry, "gpu", "throttle", t0), device_roles(bundle.manifest, gpus), stats,
        scope, sorted({float(g["power_limit_w"]) for g in facts if g.get("power_limit_w")}),
        sorted({float(g["clock_sm_max_mhz"]) for g in facts if g.get("clock_sm_max_mhz")}),
        _period_ms(bundle, power), bundle.manifest.config.get("telemetry_interval_ms"))


def visible(view: RunView, found: list[DeviceSeries]) -> np.ndarray:
    """The samples of ``found`` inside the view's time range."""
    if view.axis is None or not found:
        return np.empty(0)
    lo, hi = view.axis.lo, view.axis.hi
    return np.concatenate([s.value[(s.t >= lo) & (s.t <= hi)] for s in found])


@dataclass(frozen=True)
class Scales:
    """Ranges shared by every run's figures of one report."""

    power_top_w: dict[str, float]
    """Top of the power axis by kind (``board``, ``CPU package``): GPUs and CPUs apart."""
    clock_mhz: tuple[float, float] | None
    temp_c: tuple[float, float] | None
    """Timeline range of GPU temperature."""
    temp_mean_c: tuple[float, float] | None
    """Colour range of per-device mean temperature (heatmaps)."""
    power_mean_w: tuple[float, float] | None
    """Colour range of per-device mean power (heatmaps)."""

    @classmethod
    def of(cls, views: list[RunView]) -> "Scales":
        """The ranges that fit every view's samples (power from 0, limits and max clocks
        included).
        """
        def span(values: list[float]) -> tuple[float, float] | None:
            if not values:
                return None
            lo, hi = min(values), max(values)
            return (lo - 1, hi + 1) if hi - lo < 2 else (lo, hi)

        power: dict[str, list[float]] = {}
        for v in views:
            top = power.setdefault(v.power_kind, [])
            top += [float(x.max())] if len(x := visible(v, v.power)) else []
            top += v.power_limits_w if v.power_kind == "board" else []
        clock = [float(f(x)) for v in views if len(x := visible(v, v.clock))
                 for f in (np.min, np.max)] + [c for v in views for c in v.clock_max_mhz]
        temp = [float(f(x)) for v in views if len(x := visible(v, v.temp))
                for f in (np.min, np.max)]
        # a failed run's idle GPUs would stretch the colour ranges of every run: ok runs set
        # them when there are any (a value outside is drawn in the range's end colour)
        ok = [v for v in views if v.bundle.manifest.status == "ok" and v.stats] or views
        stats = [s for v in ok for s in v.stats.values()]
        return cls({kind: max(tops) * 1.08 for kind, tops in power.items() if tops},
                   (min(clock) * 0.95, max(clock) * 1.03) if clock else None,
                   (min(temp) - 2, max(temp) + 3) if temp else None,
                   span([s.temp_mean for s in stats if s.temp_mean is not None]),
                   span([s.power_mean for s in stats if s.power_mean is not None]))
