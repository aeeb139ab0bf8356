"""Every canonical GPU field and the NVML ways to read it on one device, best first.

A field is read either from the device's field-values request (:class:`Batched`: instant and
average power, memory temperature, PCIe and NVLink byte counters) or by a call of its own
(:class:`Call`). The slow ones (:data:`SLOW_READ_MS`) are read off the sampler's fast path,
each at its own period; the rest every tick.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from kit.telemetry.nvidia.throttle import decode_nvml_clocks_event_reasons

HOPPER_POWER_PERIOD_MS = 100.0
"""How often NVML refreshes power and the energy counter on Hopper (H100, H200): about every
100 ms (Yang et al., "Part-time Power Measurements: nvidia-smi's Lack of Attention", 2024).
``benchmarks/telemetry/nvml_probe.py`` measures it on the machine at hand."""

SLOW_READ_MS: dict[str, float] = {
    # 4 ms of CPU a read (the sampler's heaviest: 58% of its CPU at 100 ms on a busy H100,
    # benchmarks/telemetry/results/sampler-cost-h100.txt). Between readings the power samples
    # share out its rise, and it is read again at the measured phase's edges
    # (kit.metrics.energy, kit.telemetry.edges), so a slower read loses no energy.
    "energy_j": 500.0,
    # 32-bit registers (uiVal): read every 100 ms they are exact up to 42.9 GB/s per direction.
    "pcie_tx_bytes": 100.0,
    "pcie_rx_bytes": 100.0,
    # Read per link, the costliest query: 0.9 ms of CPU per link entry (36 entries a device
    # for both directions on an H200: 16-32 ms a read), 3.8 cores of sampler CPU on 4 x H200
    # read every 200 ms (benchmarks/telemetry/results/sampler-cost-h200x4.txt); NVML's own sum
    # over the links takes 0.8 ms (nvlink-aggregate-h200x2.txt), but a driver without it falls
    # back to the links. 64-bit cumulative counters: a coarser read loses only time resolution.
    "link_tx_bytes": 1000.0,
    "link_rx_bytes": 1000.0,
    # 64-bit cumulative nanoseconds, 1.3 ms per device for both (19% of the sampler's CPU at
    # 100 ms); the throttle reasons are read every tick, these only total the time.
    "viol_power_s": 500.0,
    "viol_thermal_s": 500.0,
}
"""The fields whose NVML queries are slow (1-13 ms per device each on H200, per round of two
GPUs: NVLink per-link counters 26 ms, energy 9.8 ms, violation status 2.6 ms, PCIe 1.3 ms,
each fast group about 0.2 ms; ``benchmarks/telemetry/results/h200x2-sampler-crash.md``),
and the period at which the sampler reads each, in milliseconds. All are cumulative counters:
their reads count everything between them."""

ALL_LINKS = 0xFFFFFFFF
"""Field-value scope id UINT_MAX: an NVLink throughput counter summed over every link."""

POWER_SCOPE_GPU = 0
"""Field-value scope id NVML_POWER_SCOPE_GPU: the GPU's own power. Grace Hopper would need
NVML_POWER_SCOPE_MODULE (GPU + CPU + memory) for its module; the kit targets x86 boards."""


@dataclass(frozen=True)
class Batched:
    """A field read from the device's field-values request: the sum of some entries.

    Attributes:
        label: The NVML field constant, for reasons and notes.
        ids: ``(field id, scope id)`` entries, summed (several for per-link NVLink counters).
        scale: Factor from NVML's unit to the canonical one (e.g. 1e-3 for mW -> W).
        since_start: A cumulative counter (one per entry), reported from its first reading.
        note: What the reading is, where that needs saying (e.g. instantaneous).
    """

    label: str
    ids: tuple[tuple[int, int], ...]
    scale: float
    since_start: bool = False
    note: str | None = None


@dataclass(frozen=True)
class Call:
    """A field read by its own NVML call.

    Attributes:
        label: The NVML function, for reasons and notes.
        read: Returns the field in canonical units, or a cumulative counter's raw value.
        counter_scale: For a cumulative counter: factor from its raw unit to the canonical
            one; the raw value is unwrapped (64 bits) and the field stays absolute.
        note: What the reading is, where that needs saying.
    """

    label: str
    read: Callable[[], float | int]
    counter_scale: float | None = None
    note: str | None = None


Candidate = Batched | Call | str
"""One way to read a field, tried in order; a ``str`` is a way known not to exist, and why."""


def field_value(nvml: ModuleType, name: str, scale: float, *scopes: int,
                note: str | None = None) -> Candidate:
    """A field-value candidate, or why this pynvml cannot have it."""
    if not hasattr(nvml, name):
        return f"{name} is not in this nvidia-ml-py (upgrade it)"
    return Batched(name, tuple((getattr(nvml, name), s) for s in scopes or (0,)), scale,
                   note=note)


def counter(nvml: ModuleType, name: str, scale: float, *scopes: int,
            note: str | None = None) -> Candidate:
    """Like :func:`field_value`, for a cumulative counter reported since the first read."""
    c = field_value(nvml, name, scale, *scopes, note=note)
    return c if isinstance(c, str) else replace(c, since_start=True)


def active_nvlinks(nvml: ModuleType, handle: Any) -> tuple[list[int], str]:
    """The device's NVLink links that are up, and why there are none if so."""
    active: list[int] = []
    errors: set[str] = set()
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED:
                active.append(link)
        except nvml.NVMLError as e:  # links past the device's count answer with an error
            errors.add(str(e))
    why = "no active NVLink link" + (
        f" (nvmlDeviceGetNvLinkState: {', '.join(sorted(errors))})" if errors else ""
    )
    return active, why


def candidates(
    nvml: ModuleType, handle: Any, arch: int, nvlink: bool
) -> dict[str, list[Candidate]]:
    """Every canonical GPU field and the ways to read it on this device, best first."""
    nv, h = nvml, handle
    gpu = POWER_SCOPE_GPU
    # Hopper and later have both power fields: NVML_FI_DEV_POWER_INSTANT and the 1-s
    # NVML_FI_DEV_POWER_AVERAGE. NVML documents nvmlDeviceGetPowerUsage as instantaneous on
    # GA100 and older GPUs and as a 1-s average on later ones, so it can stand in for
    # whichever field it matches. Ampere is ambiguous (GA100 vs the rest), an unknown
    # architecture more so: no stand-in there.
    instant: list[Candidate] = [
        field_value(nv, "NVML_FI_DEV_POWER_INSTANT", 1e-3, gpu, note="instantaneous")]
    average: list[Candidate] = [
        field_value(nv, "NVML_FI_DEV_POWER_AVERAGE", 1e-3, gpu, note="the driver's 1-s average")]
    if arch < nv.NVML_DEVICE_ARCH_AMPERE:
        instant.append(Call("nvmlDeviceGetPowerUsage",
                            lambda: nv.nvmlDeviceGetPowerUsage(h) * 1e-3,
                            note="instantaneous on GA100 and older GPUs (NVML docs)"))
    elif nv.NVML_DEVICE_ARCH_AMPERE < arch < nv.NVML_DEVICE_ARCH_UNKNOWN:
        average.append(Call("nvmlDeviceGetPowerUsage",
                            lambda: nv.nvmlDeviceGetPowerUsage(h) * 1e-3,
                            note="a 1-s average after Ampere (NVML docs)"))
    links, no_link_why = (
        active_nvlinks(nv, h) if nvlink else ([], "NVLink counters not requested (nvlink=False)")
    )

    def violation_s(policy: int) -> Call:
        # violationTime: cumulative nanoseconds the policy held the clocks below target.
        return Call(
            "nvmlDeviceGetViolationStatus",
            lambda: nv.nvmlDeviceGetViolationStatus(h, policy).violationTime,
            counter_scale=1e-9,
        )

    def throttle_bits(name: str) -> Call:
        reasons = getattr(nv, name)
        return Call(name, lambda: decode_nvml_clocks_event_reasons(reasons(h)))

    def nvlink_bytes(name: str) -> list[Candidate]:
        # NVML sums every link itself for scope id UINT_MAX (nvml.h, "NVLink throughput
        # counters field values"): one entry a read instead of one per link, each of which
        # costs about 0.9 ms of CPU. Else one KiB counter per link that is up, summed here.
        if not links:
            return [no_link_why]
        return [counter(nv, name, 1024, ALL_LINKS, note="every link, summed by NVML"),
                counter(nv, name, 1024, *links)]

    return {
        "power_w": instant,
        "power_avg_w": average,
        "energy_j": [
            Call(
                "nvmlDeviceGetTotalEnergyConsumption",  # mJ since the driver was loaded
                lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
                counter_scale=1e-3,
            )
        ],
        "temp_gpu_c": [
            Call(
                "nvmlDeviceGetTemperature",
                lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            )
        ],
        "temp_mem_c": [field_value(nv, "NVML_FI_DEV_MEMORY_TEMP", 1.0)],
        "clock_sm_mhz": [
            Call(
                "nvmlDeviceGetClockInfo",
                lambda: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            )
        ],
        "clock_mem_mhz": [
            Call(
                "nvmlDeviceGetClockInfo",
                lambda: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            )
        ],
        "util_gpu_pct": [
            Call(
                "nvmlDeviceGetUtilizationRates",
                lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu),
            )
        ],
        "mem_used_bytes": [
            Call("nvmlDeviceGetMemoryInfo", lambda: int(nv.nvmlDeviceGetMemoryInfo(h).used))
        ],
        # The "ClocksEvent" name needs a newer driver; the older one reads the same bits.
        "throttle": [
            throttle_bits(name)
            for name in (
                "nvmlDeviceGetCurrentClocksEventReasons",
                "nvmlDeviceGetCurrentClocksThrottleReasons",
            )
            if hasattr(nv, name)
        ],
        "viol_power_s": [violation_s(nv.NVML_PERF_POLICY_POWER)],
        "viol_thermal_s": [violation_s(nv.NVML_PERF_POLICY_THERMAL)],
        # Cumulative byte counters, unlike nvmlDeviceGetPcieThroughput (a rate over ~20 ms).
        "pcie_tx_bytes": [counter(nv, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 1)],
        "pcie_rx_bytes": [counter(nv, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 1)],
        "link_tx_bytes": nvlink_bytes("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"),
        "link_rx_bytes": nvlink_bytes("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"),
    }


def update_period_ms(nvml: ModuleType, name: str, arch: int) -> float | None:
    """The counter's refresh period where documented or published, else ``None``."""
    if arch == nvml.NVML_DEVICE_ARCH_HOPPER and name in ("power_w", "energy_j"):
        return HOPPER_POWER_PERIOD_MS
    return None
