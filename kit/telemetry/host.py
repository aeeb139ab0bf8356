"""Host telemetry: CPU utilisation and memory from psutil, CPU package power from RAPL.

RAPL (Running Average Power Limit) is read through the kernel's powercap sysfs interface,
``/sys/class/powercap/intel-rapl:N/energy_uj`` (AMD CPUs use the same driver and names). Hosts
without it (VMs, containers without /sys, ARM) leave ``cpu_power_w`` null, with the reason.
"""

import os
from pathlib import Path
from typing import Any

import psutil

from kit.bundle.telemetry_fields import make_row
from kit.telemetry.base import (
    FieldInfo,
    TelemetryError,
    TelemetryNotSupportedError,
    TelemetrySource,
)
from kit.telemetry.counters import WrappingCounter, describe_events

POWERCAP_ROOT = Path("/sys/class/powercap")
"""Where the kernel exposes powercap (RAPL) zones."""

RAPL_UPDATE_PERIOD_MS = 1.0
"""RAPL energy status registers refresh about every millisecond (Intel SDM, vol. 3B, 15.10)."""


def _read_int(path: Path) -> int:
    """Read a sysfs file holding one integer."""
    return int(path.read_text().strip())


class RaplPackagePower:
    """CPU package power from the RAPL energy counters, summed over all packages (sockets).

    Power is the energy counted between two reads divided by the time between them, so the
    first read gives ``None``. Each package's counter wraps at its ``max_energy_range_uj`` (the
    kernel's range is 2^32 raw energy units, which is one unit more: at most 61 uJ, not
    readable from sysfs) and is accumulated by :class:`~kit.telemetry.counters.WrappingCounter`.

    Args:
        root: The powercap directory; the default is the kernel's. Tests point it at a tree of
            the same layout.

    Raises:
        TelemetryNotSupportedError: No package domain under ``root``, or its counters cannot
            be read (e.g. permission denied); the message says which.
    """

    def __init__(self, root: Path = POWERCAP_ROOT) -> None:
        if not root.is_dir():
            raise TelemetryNotSupportedError(f"RAPL not exposed ({root} absent)")
        try:
            # Sub-zones (intel-rapl:0:0 = core, dram, ...) are inside their package's energy;
            # only "package-N" zones are summed. intel-rapl-mmio:* duplicates them and is skipped.
            zones = sorted(root.glob("intel-rapl:*"))
            packages = [z for z in zones if (z / "name").read_text().startswith("package")]
            self._energy_files = [z / "energy_uj" for z in packages]
            self._counters = [
                WrappingCounter(_read_int(z / "max_energy_range_uj")) for z in packages
            ]
        except (OSError, ValueError) as e:
            raise TelemetryNotSupportedError(f"RAPL zones under {root} unreadable: {e}") from e
        if not packages:
            raise TelemetryNotSupportedError(f"RAPL not exposed (no package zone under {root})")
        self._read_energy_uj()  # Fail now, not mid-run, when the counters are not readable.
        self._last: tuple[float, float] | None = None  # (t, uJ counted since the first read)

    def _read_energy_uj(self) -> list[int]:
        """Read every package's cumulative energy counter, in microjoules."""
        try:
            return [_read_int(f) for f in self._energy_files]
        except PermissionError as e:
            # Since Linux 5.10 (CVE-2020-8694, "PLATYPUS") energy_uj is readable by root only.
            raise TelemetryNotSupportedError(
                f"permission denied reading {e.filename} (root-only since Linux 5.10; "
                "run as root or make energy_uj readable)"
            ) from e
        except (OSError, ValueError) as e:
            raise TelemetryError(f"RAPL read failed: {e}") from e

    def power_w(self, t: float) -> float | None:
        """Return the mean package power since the previous call, in watts.

        Args:
            t: Time of this read in seconds, on the same clock as the previous call.

        Returns:
            Watts summed over packages, or ``None`` on the first call (no interval yet) or when
            ``t`` did not advance.
        """
        readings = self._read_energy_uj()
        for counter, uj in zip(self._counters, readings, strict=True):
            counter.update(uj, t)
        last, self._last = self._last, (t, sum(c.advance for c in self._counters))
        if last is None or t <= last[0]:
            return None
        return (self._last[1] - last[1]) * 1e-6 / (t - last[0])

    def describe_events(self) -> str | None:
        """The packages' wraps so far, in one sentence; ``None`` if none."""
        return describe_events(self._counters, "RAPL energy_uj")


def _busy_and_total_s(times: Any) -> tuple[float, float]:
    """Busy and total CPU seconds, summed over CPUs, from a ``psutil.cpu_times()`` result."""
    # On Linux guest time is already counted inside user (and guest_nice inside nice).
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


class HostSource(TelemetrySource):
    """One host row per tick: CPU utilisation, used memory and (with RAPL) CPU power.

    Utilisation is computed from this instance's own previous CPU times rather than
    ``psutil.cpu_percent``, which keeps that state in a module global and returns a made-up
    0.0 when the kernel's tick counters did not advance between two calls (they advance every
    ``1/USER_HZ`` s, 10 ms on Linux); here that case is ``None``.

    Args:
        node: Node index written into every row.
        powercap_root: Where to look for RAPL zones.
    """

    name = "host"

    def __init__(self, node: int, powercap_root: Path = POWERCAP_ROOT) -> None:
        self._node = node
        self._last_cpu = _busy_and_total_s(psutil.cpu_times())
        self._rapl: RaplPackagePower | None = None
        self._rapl_info = FieldInfo(True, update_period_ms=RAPL_UPDATE_PERIOD_MS)
        try:
            self._rapl = RaplPackagePower(powercap_root)
        except TelemetryNotSupportedError as e:
            self._rapl_info = FieldInfo(False, reason=str(e))

    def fields(self) -> dict[str, FieldInfo]:
        """Return which host fields are readable here; at the end, with the RAPL wraps seen."""
        rapl = self._rapl_info
        events = self._rapl.describe_events() if self._rapl else None
        return {
            "cpu_util_pct": FieldInfo(True, update_period_ms=1000.0 / os.sysconf("SC_CLK_TCK")),
            "host_mem_used_bytes": FieldInfo(True),
            "cpu_power_w": FieldInfo(rapl.readable, events, rapl.update_period_ms)
            if events else rapl,
        }

    def sample(self, t: float) -> list[dict[str, Any]]:
        """Read the host counters once; see :meth:`TelemetrySource.sample`."""
        try:
            busy_s, total_s = _busy_and_total_s(psutil.cpu_times())
            mem = psutil.virtual_memory()
        except (psutil.Error, OSError) as e:
            raise TelemetryError(f"host counters unreadable: {e}") from e
        busy0_s, total0_s = self._last_cpu
        self._last_cpu = (busy_s, total_s)
        dt_s = total_s - total0_s
        return [
            make_row(
                t,
                self._node,
                None,
                "host",
                # clamped: busy and total come from float sums of per-state times, so an idle
                # interval can come out as -2e-9 %
                cpu_util_pct=min(100.0, max(0.0, 100.0 * (busy_s - busy0_s) / dt_s))
                if dt_s > 0 else None,
                host_mem_used_bytes=mem.total - mem.available,
                cpu_power_w=self._rapl.power_w(t) if self._rapl else None,
            )
        ]

    def close(self) -> None:
        """Nothing to release: psutil and sysfs reads hold no handles between samples."""
