"""Zeus energy windows in the training rank (one around the measured phase: kit.launch.worker).

Unlike the node sampler, these windows live in the training rank: Zeus's ``ZeusMonitor``
reads the GPU's hardware energy counter (through NVML on NVIDIA, AMD SMI on AMD) at the
boundaries the rank itself marks, after synchronizing its device. Each rank measures the one
GPU it drives. ``metrics.json`` ``power.zeus_vs_counter`` cross-checks their sum against the
sampler's counter (:func:`kit.metrics.power.zeus_cross_check`).
"""

import sys
import types
from typing import Any

import numpy as np

from kit.telemetry.base import TelemetryError, TelemetryNotSupportedError


def _trapezoid_auc(x: Any, y: Any) -> float:
    """Area under ``y`` over increasing ``x`` by the trapezoid rule: scikit-learn's ``auc``."""
    trapezoid = getattr(np, "trapezoid", None) or np.trapz  # numpy < 2 names it trapz
    return float(trapezoid(y, x))


def import_zeus_monitor() -> type:
    """Zeus's ``ZeusMonitor``, imported without scikit-learn unless it is loaded already.

    ``zeus.monitor.power`` imports ``sklearn.metrics.auc`` at module level for one use: the
    area under a ``PowerMonitor``'s power timeline, which ``ZeusMonitor`` builds only for GPUs
    without an energy counter (older than Volta). Importing scikit-learn, and scipy.stats with
    it, took 4.5 s of every rank's first step on an H200
    (benchmarks/startup/results/first-step-pyspy-h200x1-becd4f9.txt). While zeus imports,
    ``sklearn.metrics`` is a module holding only ``auc`` (the same trapezoid rule); afterwards
    both names leave ``sys.modules``, so whatever imports scikit-learn later gets the real one.

    Raises:
        ImportError: Zeus is not installed.
    """
    if "zeus.monitor" in sys.modules or "sklearn" in sys.modules:
        from zeus.monitor import ZeusMonitor
        return ZeusMonitor
    package, metrics = types.ModuleType("sklearn"), types.ModuleType("sklearn.metrics")
    metrics.auc = _trapezoid_auc  # type: ignore[attr-defined]
    package.metrics = metrics  # type: ignore[attr-defined]
    sys.modules.update({"sklearn": package, "sklearn.metrics": metrics})
    try:
        from zeus.monitor import ZeusMonitor
    finally:
        for name, module in (("sklearn", package), ("sklearn.metrics", metrics)):
            if sys.modules.get(name) is module:
                del sys.modules[name]
    return ZeusMonitor


class ZeusStepEnergy:
    """Energy of one GPU over each step and over the measured phase, from Zeus 0.16."""

    def __init__(self, gpu_index: int) -> None:
        """Open a Zeus monitor on ``gpu_index`` (as Zeus counts, after CUDA_VISIBLE_DEVICES).

        Raises:
            TelemetryNotSupportedError: Zeus is not installed or finds no usable GPU.
        """
        try:
            ZeusMonitor = import_zeus_monitor()
        except ImportError as e:
            raise TelemetryNotSupportedError(f"zeus is not installed: {e}") from None
        self._gpu = gpu_index
        try:
            self._monitor: Any = ZeusMonitor(
                gpu_indices=[gpu_index], cpu_indices=[], approx_instant_energy=True
            )
        except Exception as e:  # Zeus raises its own hierarchy; keep the kit's at the boundary
            raise TelemetryNotSupportedError(f"zeus monitor unavailable: {e}") from None

    def begin(self, key: str) -> None:
        """Open window ``key`` (the caller has already synchronized the device)."""
        try:
            self._monitor.begin_window(key, sync_execution=False)
        except Exception as e:
            raise TelemetryError(f"zeus begin_window {key}: {e}") from e

    def end(self, key: str) -> float | None:
        """Close window ``key``; return the GPU's energy over it in joules (None if unknown)."""
        try:
            measurement = self._monitor.end_window(key, sync_execution=False)
        except Exception as e:
            raise TelemetryError(f"zeus end_window {key}: {e}") from e
        energy = measurement.gpu_energy.get(self._gpu)
        return None if energy is None else float(energy)
