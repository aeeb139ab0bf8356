"""How each canonical field is read on one AMD GPU: not yet verified on hardware.

:func:`readers` gives every field its reader (or why it has none) for one device; a reader
takes a :class:`Tick`, which makes each AMD SMI call once however many fields need its answer.
The stateful readers (xGMI counters, MI300 throttle residency, the energy counter) keep what
they learned for the final verdicts. Which fields are slow (:data:`SLOW_READ_MS`) is decided
here too: the sampler reads those off its fast path.
"""

import ctypes
from collections.abc import Callable
from types import ModuleType
from typing import Any

from kit.telemetry.amd.quirks import (
    AsicFamily,
    EnergyCounterCheck,
    ResidencyThrottle,
    decode_amd_throttle_status,
    energy_unit_j,
)
from kit.telemetry.counters import WrappingCounter, describe_events

_ALL_ONES = frozenset({0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})
"""Sentinels AMD SMI leaves in a numeric field the device does not support (only some are
turned into "N/A" by the Python layer, e.g. power only at 0xFFFF)."""

_KIB = 1024
"""Bytes per "KiloByte" of gpu_metrics' xGMI counters (kgd_pp_interface.h says KiloBytes)."""

SLOW_READ_MS: dict[str, float] = {"energy_j": 100.0, "link_tx_bytes": 100.0,
                                  "link_rx_bytes": 100.0}
"""The cumulative counters, read off the sampler's fast path at these periods (ms): the energy
accumulator (``amdsmi_get_energy_count``, whose check also reads power in the same read) and
the xGMI data counters. Cumulative, so their reads count everything between them; the fast
path then makes only the calls the instantaneous fields need. Not yet verified on hardware:
which AMD SMI calls are slow on an MI250 or MI300 node is not measured."""




def num(value: Any) -> float | None:
    """A reading as a float; ``None`` where AMD SMI marks it unsupported ("N/A" or all ones).

    Not yet verified on hardware.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or value in _ALL_ONES:
        return None
    return float(value)


def key(answer: dict[str, Any], *names: str) -> Any:
    """The first of ``names`` present in an AMD SMI answer (releases rename keys).

    Not yet verified on hardware.

    Raises:
        KeyError: None of them is there; the message names them.
    """
    for name in names:
        if name in answer:
            return answer[name]
    raise KeyError(" or ".join(names))


class Tick:
    """One device's AMD SMI answers within one tick: each call made once, its failure kept.

    Not yet verified on hardware.

    Args:
        smi: The amdsmi module.
        t: The tick's time, unix seconds.
    """

    def __init__(self, smi: ModuleType, t: float) -> None:
        self._smi = smi
        self.t = t
        self._answers: dict[str, tuple[Any, Exception | None]] = {}

    def get(self, key: str, call: Callable[[], Any]) -> Any:
        """``call()``'s answer, made on the first ``get`` of ``key`` this tick.

        Not yet verified on hardware.
        """
        if key not in self._answers:
            try:
                self._answers[key] = (call(), None)
            except self._smi.AmdSmiException as e:
                self._answers[key] = (None, e)
        answer, error = self._answers[key]
        if error is not None:
            raise error
        return answer


Reader = Callable[[Tick], float | int | None]
"""Reads one field in canonical units; ``None`` when AMD SMI says N/A this time."""


class Xgmi:
    """An xGMI data counter: bytes since the first read, summed over links.

    Not yet verified on hardware. Each link is unwrapped on its own.

    gpu_metrics v1.4+ (MI300) has per-link ``xgmi_read_data_acc`` / ``xgmi_write_data_acc``
    in KiB, 64-bit: a drop is a reset, not a wrap. MI200's v1.3 has none and reads N/A.
    """

    def __init__(self, metrics: Callable[[Tick], dict[str, Any]], key: str) -> None:
        self._metrics = metrics
        self._key = key
        self._links: dict[int, WrappingCounter] = {}

    def __call__(self, tick: Tick) -> int | None:
        """Bytes since the first read; ``None`` when no link reports or one reset.

        Not yet verified on hardware.
        """
        reset = False
        for link, kib in enumerate(self._metrics(tick)[self._key]):
            if num(kib) is not None:
                counter = self._links.setdefault(link, WrappingCounter(None))
                reset |= counter.update(kib, tick.t) is None
        if reset or not self._links:
            return None
        return int(sum(c.advance for c in self._links.values()) * _KIB)

    def events(self) -> str | None:
        """The links' resets, in one sentence. Not yet verified on hardware."""
        return describe_events(list(self._links.values()), f"gpu_metrics {self._key}")


class Mi300Throttle:
    """MI300+ throttle reasons from gpu_metrics residency counters (quirk (b)).

    Not yet verified on hardware.
    """

    def __init__(self, metrics: Callable[[Tick], dict[str, Any]]) -> None:
        self._metrics = metrics
        self._residency = ResidencyThrottle()

    def probe(self, tick: Tick) -> float | None:
        """The accumulation counter, to see the counters exist; primes the first interval.

        Not yet verified on hardware.
        """
        metrics = self._metrics(tick)
        self._residency.update(metrics, tick.t)
        return num(metrics["accumulation_counter"])

    def __call__(self, tick: Tick) -> int | None:
        """The kit's throttle bits over the last interval. Not yet verified on hardware."""
        bits = self._residency.update(self._metrics(tick), tick.t)
        return None if bits is None else decode_amd_throttle_status(bits, "mi300")

    def events(self) -> str | None:
        """The residency counters' wraps. Not yet verified on hardware."""
        return self._residency.describe_events()


class Energy:
    """The energy accumulator in joules: exact unit, unwrapped, and checked (quirks (c), (d)).

    Not yet verified on hardware.

    Args:
        read_raw: Returns ``amdsmi_get_energy_count``'s dict.
        power: Reads the power that vouches for the counter, in the same tick.
        gfx_target: The device's gfx target, when known (for the unit).
    """

    def __init__(self, read_raw: Callable[[Tick], dict[str, Any]], power: Reader,
                 gfx_target: str | None) -> None:
        self._read_raw = read_raw
        self._power = power
        self._gfx_target = gfx_target
        self._counter = WrappingCounter(None)  # amdsmi's energy_accumulator is uint64
        self._first: float | None = None
        self.unit_j: float | None = None
        self.unit_note = ""
        self.check = EnergyCounterCheck()

    def _raw(self, tick: Tick) -> float | None:
        """The raw accumulator; the first answer also fixes the unit.

        Not yet verified on hardware.
        """
        answer = self._read_raw(tick)
        if self.unit_j is None:
            self.unit_j, self.unit_note = energy_unit_j(
                self._gfx_target, float(answer["counter_resolution"]))
        # releases before 6.3 name the accumulator "power"; 6.3 has both, 7.0 only the new name
        return num(key(answer, "energy_accumulator", "power"))

    def _unwrapped(self, raw: float, t: float) -> float | None:
        """Counts since the driver started, unwrapped; ``None`` on a reset.

        Not yet verified on hardware.
        """
        if self._first is None:
            self._first = raw
        advance = self._counter.update(raw, t)
        return None if advance is None else self._first + advance

    def probe(self, tick: Tick) -> float | None:
        """The raw accumulator, also its first reading. Not yet verified on hardware."""
        raw = self._raw(tick)
        if raw is not None:
            self._unwrapped(raw, tick.t)
        return raw

    def __call__(self, tick: Tick) -> float | None:
        """Joules, once the counter is trusted; ``None`` before and after.

        Not yet verified on hardware.
        """
        if self.check.ok is False:
            return None
        raw = self._raw(tick)
        if raw is None:
            return None
        before = (self._first or 0.0) + self._counter.advance
        counts = self._unwrapped(raw, tick.t)
        if counts is None:
            self.check.drop(f"energy counter ran backwards at t={tick.t:.3f} ({before:.0f} -> "
                            f"{raw:.0f} counts; ROCm/amdsmi#115); dropped from then on")
            return None
        return self.check.feed(tick.t, self._power(tick), counts * (self.unit_j or 0.0))

    def events(self) -> str:
        """The unit used and the check's verdict so far. Not yet verified on hardware."""
        return "; ".join(filter(None, [self.unit_note, self.check.reason]))


def _raw_throttle_status(smi: ModuleType, handle: Any) -> int | None:
    """MI200 gpu_metrics ``throttle_status`` with its bits; ``None`` when not reported.

    Not yet verified on hardware.

    ``amdsmi_get_gpu_metrics_info`` turns ``throttle_status`` into a bool in every release
    checked (6.1.2: ``bool(...)``; 6.3.3 and 7.0.2: ``_validate_if_max_uint(..., isBool=True)``),
    losing which limiter is active, so the same documented C call is made through the
    package's own ctypes binding (``amdsmi_wrapper``) to keep the bits.
    """
    w = smi.amdsmi_wrapper
    metrics = w.amdsmi_gpu_metrics_t()
    status = w.amdsmi_get_gpu_metrics_info(handle, ctypes.byref(metrics))
    if status != w.AMDSMI_STATUS_SUCCESS:
        raise smi.AmdSmiLibraryException(status)
    return None if metrics.throttle_status in _ALL_ONES else int(metrics.throttle_status)


def readers(
    smi: ModuleType, h: Any, family: AsicFamily | None, gfx_target: str | None
) -> dict[str, tuple[str, Reader] | str]:
    """Every canonical GPU field: ``(label, reader)`` on this device, or why there is none.

    Not yet verified on hardware.
    """
    current = smi.AmdSmiTemperatureMetric.CURRENT

    def metrics(tick: Tick) -> dict[str, Any]:
        return tick.get("gpu_metrics", lambda: smi.amdsmi_get_gpu_metrics_info(h))

    def power(key: str) -> tuple[str, Reader]:
        # Watts (amdsmi.h, amdsmi_power_info_t): current_socket_power on MI300+,
        # average_socket_power on MI200 and older; the other reads N/A.
        return f"amdsmi_get_power_info {key}", lambda tick: num(
            tick.get("power_info", lambda: smi.amdsmi_get_power_info(h))[key])

    def temp(sensor: Any) -> tuple[str, Reader]:
        return f"amdsmi_get_temp_metric {sensor.name}", lambda tick: num(
            tick.get(f"temp {sensor.name}", lambda: smi.amdsmi_get_temp_metric(h, sensor, current))
        )

    def clock(kind: Any) -> tuple[str, Reader]:
        # "clk" from 6.2 on; 6.1 names it "cur_clk"
        return f"amdsmi_get_clock_info {kind.name}", lambda tick: num(key(
            tick.get(f"clock {kind.name}", lambda: smi.amdsmi_get_clock_info(h, kind)),
            "clk", "cur_clk"))

    def used_bytes(tick: Tick) -> int | None:
        used = num(tick.get("vram", lambda: smi.amdsmi_get_gpu_memory_usage(
            h, smi.AmdSmiMemoryType.VRAM)))
        return None if used is None else int(used)

    def check_power(tick: Tick) -> float | None:
        info = tick.get("power_info", lambda: smi.amdsmi_get_power_info(h))
        return next((p for p in map(num, (info.get("current_socket_power"),
                                           info.get("average_socket_power"))) if p is not None),
                    None)

    throttle: tuple[str, Reader] | str
    if family == "mi200":
        throttle = (
            "gpu_metrics throttle_status (MI200 bits)",
            lambda tick: _decoded(tick.get("raw_throttle", lambda: _raw_throttle_status(smi, h))),
        )
    elif family == "mi300":
        throttle = ("gpu_metrics accumulation_counter and *_residency_acc, differenced between "
                    "ticks (what amdsmi_get_violation_status computes, without its 100 ms sleep)",
                    Mi300Throttle(metrics))
    else:
        throttle = "throttle decoding is written for MI200 (gfx90a) and MI300+ (gfx94x/95x) only"
    no_pcie = (
        "gpu_metrics has only pcie_bandwidth_acc, an accumulated bandwidth (GB/s) of both "
        "directions together, not bytes per direction"
    )
    no_viol = "AMD SMI reports violation residency as counts and percentages, not seconds"
    return {
        "power_w": power("current_socket_power"),
        "power_avg_w": power("average_socket_power"),
        "energy_j": ("amdsmi_get_energy_count", Energy(
            lambda tick: tick.get("energy", lambda: smi.amdsmi_get_energy_count(h)),
            check_power, gfx_target)),
        "temp_gpu_c": temp(smi.AmdSmiTemperatureType.HOTSPOT),
        "temp_mem_c": temp(smi.AmdSmiTemperatureType.VRAM),
        "clock_sm_mhz": clock(smi.AmdSmiClkType.GFX),
        "clock_mem_mhz": clock(smi.AmdSmiClkType.MEM),
        "util_gpu_pct": (
            "amdsmi_get_gpu_activity gfx_activity",
            lambda tick: num(tick.get("activity", lambda: smi.amdsmi_get_gpu_activity(h))[
                "gfx_activity"]),
        ),
        "mem_used_bytes": ("amdsmi_get_gpu_memory_usage VRAM", used_bytes),
        "throttle": throttle,
        # gpu_metrics names the directions read and write; read data arrives at this GPU.
        "link_rx_bytes": ("amdsmi_get_gpu_metrics_info xgmi_read_data_acc",
                          Xgmi(metrics, "xgmi_read_data_acc")),
        "link_tx_bytes": ("amdsmi_get_gpu_metrics_info xgmi_write_data_acc",
                          Xgmi(metrics, "xgmi_write_data_acc")),
        "pcie_tx_bytes": no_pcie,
        "pcie_rx_bytes": no_pcie,
        "viol_power_s": no_viol,
        "viol_thermal_s": no_viol,
    }


def _decoded(bits: int | None) -> int | None:
    """MI200 :func:`decode_amd_throttle_status`, passing ``None`` (not reported) through.

    Not yet verified on hardware.
    """
    return None if bits is None else decode_amd_throttle_status(bits, "mi200")




def scaled(value: Any, factor: float) -> float | None:
    """``value`` x ``factor``, or ``None`` where AMD SMI says N/A. Not yet verified on hardware."""
    number = num(value)
    return None if number is None else number * factor
