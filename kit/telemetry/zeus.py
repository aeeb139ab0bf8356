"""Zeus energy windows around each measured step and the whole measured phase, per rank.

Unlike the node sampler, these windows live in the training rank: Zeus's ``ZeusMonitor``
reads the GPU's hardware energy counter (through NVML on NVIDIA, AMD SMI on AMD) at the exact
step boundaries the rank itself marks, so step energy needs no interpolation. Each rank
measures the one GPU it drives. ``metrics.json`` ``power.zeus_vs_counter`` cross-checks their
sum against the sampler's counter (:func:`kit.analysis.power.zeus_cross_check`).
"""

from typing import Any

from kit.telemetry.base import TelemetryError, TelemetryNotSupportedError


class ZeusStepEnergy:
    """Energy of one GPU over each step and over the measured phase, from Zeus 0.16."""

    def __init__(self, gpu_index: int) -> None:
        """Open a Zeus monitor on ``gpu_index`` (as Zeus counts, after CUDA_VISIBLE_DEVICES).

        Raises:
            TelemetryNotSupportedError: Zeus is not installed or finds no usable GPU.
        """
        try:
            from zeus.monitor import ZeusMonitor
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
