"""AMD GPU telemetry through AMD SMI (ROCm's ``amdsmi`` package): not yet verified on hardware.

Written against AMD SMI's documented API (the amdsmi 7.0.2 Python interface and ``amdsmi.h``)
and the amdgpu kernel driver's headers, with no AMD GPU reachable: every reason this backend
gives, in :meth:`AmdSmiSource.fields` and so in every bundle that uses it, says "not yet
verified on hardware". ``docs/telemetry-amd.md`` says how to verify it on an MI250 node.

Per device and tick it reads current and average socket power (``amdsmi_get_power_info``),
the energy accumulator (``amdsmi_get_energy_count``), hotspot and VRAM temperature
(``amdsmi_get_temp_metric``), GFX and memory clocks (``amdsmi_get_clock_info``), GFX activity
(``amdsmi_get_gpu_activity``), VRAM used (``amdsmi_get_gpu_memory_usage``), throttle reasons
and, where gpu_metrics has them, xGMI data counters (``amdsmi_get_gpu_metrics_info``). What a
device cannot read is found once, at construction, and stays ``None`` with the reason.

``temp_gpu_c`` is the hotspot (junction) sensor, not the edge one: hotspot is what the SMU's
thermal throttler acts on (aldebaran ``PPTable_t.ThotspotLimit`` drives ``THROTTLER_TEMP_GPU``),
and MI300's gpu_metrics (v1.4+) has no edge temperature at all.

Device indices are AMD SMI's (its processor handles, in PCI bus order), which can differ from
HIP's; match ranks to devices by the UUIDs in :meth:`AmdSmiSource.devices`.

Hardware quirks, each in a small pure function tested without hardware:

(a) MI250: each package has two GCDs, shown as two devices; only the even (primary) one
    reports power, and it reports the whole package (:func:`mi250_die`,
    :func:`attribute_package_power`).
(b) Throttle reasons: MI200 reports ASIC-specific bits in gpu_metrics ``throttle_status``;
    MI300+ reports through the violation API instead (:func:`decode_amd_throttle_status`,
    :func:`violation_throttle_bits`).
(c) The energy counter is known to stall or run backwards on some parts and drivers
    (ROCm/amdsmi#38, #115): it is checked against power x time before it is trusted
    (:func:`energy_counter_plausible`, :class:`EnergyCounterCheck`).
"""

import ctypes
import importlib
import io
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stdout, suppress
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import pairwise
from types import ModuleType
from typing import Any, Literal

from kit.bundle.schema import THROTTLE_BITS
from kit.telemetry.base import (
    FieldInfo,
    TelemetryError,
    TelemetryNotSupportedError,
    TelemetrySource,
)
from kit.telemetry.fields import make_row

logger = logging.getLogger(__name__)

NOT_VERIFIED = "not yet verified on hardware"
"""Appended to every reason this backend reports, until an AMD GPU run has checked it."""

MI250_ODD_DIE_REASON = "MI250: package power reported on the primary GCD"
"""Why an MI250's odd (secondary) GCD has no power or energy of its own."""

ENERGY_CHECK_MIN_S = 1.0
"""Quirk (c): seconds of samples compared before the energy counter is trusted."""

ENERGY_CHECK_MIN_SAMPLES = 5
"""Quirk (c): samples compared, at least, before the energy counter is trusted."""

ENERGY_RATIO_RANGE = (0.5, 2.0)
"""Quirk (c): counter / (power x time) outside this range means the counter is broken."""

MAX_PLAUSIBLE_TEMP_C = 200.0
"""A first temperature above this is not in deg C: amdsmi.h says ``amdsmi_get_temp_metric``
returns degrees C, AMD SMI's Python docs say millidegrees; such a sensor is not used."""

AsicFamily = Literal["mi200", "mi300"]
"""Which throttle-reason bit layout a device uses (quirk (b))."""

_LIBRARY_MISSING = (
    "AMD SMI library not found (libamd_smi.so): install ROCm's amd-smi-lib and the amdsmi "
    "Python package of the same ROCm release, or set ROCM_PATH to the ROCm install"
)

_ALL_ONES = frozenset({0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})
"""Sentinels AMD SMI writes into a numeric field the device does not support."""

# --- quirk (a): MI250 package power ---------------------------------------------------------


@dataclass(frozen=True)
class Mi250Die:
    """Where one MI250 GCD sits: its package (OAM module) and die within it.

    Not yet verified on hardware.

    Attributes:
        package: Package index, counting packages in AMD SMI device order.
        die: 0 for the primary GCD (it reports the package's power), 1 for the secondary.
    """

    package: int
    die: int


def mi250_die(index: int, market_name: str) -> Mi250Die | None:
    """Return the package and die of an MI250/MI250X GCD; ``None`` for any other GPU.

    Not yet verified on hardware. AMD SMI lists both GCDs of a package next to each other
    (consecutive PCI functions of one OAM), so devices ``2k`` and ``2k+1`` are package
    ``k``, the even one primary; Zeus (``zeus/device/gpu/amd.py``) relies on the same pairing.
    MI210 is a single-GCD MI200 and is not affected.

    Args:
        index: The device's AMD SMI index.
        market_name: ``amdsmi_get_gpu_asic_info(...)["market_name"]``.
    """
    if "MI250" not in market_name:
        return None
    package, die = divmod(index, 2)
    return Mi250Die(package, die)


def attribute_package_power(
    die: Mi250Die | None, power_w: float | None
) -> tuple[float | None, str | None]:
    """Return the power (or energy) to record for one device, and a note on what it covers.

    Not yet verified on hardware. On MI250 the primary GCD reports the power of the whole
    package and the secondary reports 0 W (ROCm/rocm_smi_lib#160, mlco2/codecarbon#1097):
    recording that 0 would be a made-up reading, so the secondary's value is ``None``.

    Args:
        die: :func:`mi250_die` of the device; ``None`` when it is not an MI250.
        power_w: What AMD SMI read for this device (power, or energy: both are package-wide).

    Returns:
        ``(value, note)``: the reading and ``None`` on other GPUs; the reading and a note that
        it covers both GCDs on an MI250 primary; ``None`` and :data:`MI250_ODD_DIE_REASON` on
        an MI250 secondary.
    """
    if die is None:
        return power_w, None
    if die.die == 0:
        return power_w, "MI250: package power of this GCD and the next (secondary) one"
    return None, MI250_ODD_DIE_REASON


# --- quirk (b): throttle reasons --------------------------------------------------------------
#
# MI200 (aldebaran) throttle_status: the PMFW's ASIC-specific bits, THROTTLER_*_BIT in
# drivers/gpu/drm/amd/pm/swsmu/inc/pmfw_if/smu13_driver_if_aldebaran.h; bits 5, 8-10 and
# 14-18 are spare. aldebaran_ppt.c copies them into gpu_metrics v1.3 unchanged.
# MI300+ (smu_v13_0_6): gpu_metrics throttle_status is no longer filled (AMD SMI "GPU
# violations" docs: it reads N/A); the reasons are the five THROTTLER_*_BIT of
# smu_v13_0_6_pmfw.h, which amdsmi_get_violation_status reports as its active_* flags.
# Mapping to the kit's bits: PPT (package power tracking) is the power cap; the SMU's own
# temperature loops (GPU hotspot, memory, VR, socket) are software thermal throttling; PROCHOT
# is the hardware "processor hot" signal. TDC (current limits) and APCC (peak current
# control) limit current, not power or temperature, and have no kit bit: "other".

_MI200_THROTTLER: dict[int, tuple[str, str]] = {
    0: ("PPT0", "power_cap"),
    1: ("PPT1", "power_cap"),
    2: ("TDC_GFX", "other"),
    3: ("TDC_SOC", "other"),
    4: ("TDC_HBM", "other"),
    6: ("TEMP_GPU", "thermal_sw"),  # hotspot, against ThotspotLimit
    7: ("TEMP_MEM", "thermal_sw"),  # HBM, against TmemLimit
    11: ("TEMP_VR_GFX", "thermal_sw"),
    12: ("TEMP_VR_SOC", "thermal_sw"),
    13: ("TEMP_VR_MEM", "thermal_sw"),
    19: ("APCC", "other"),
}
_MI300_THROTTLER: dict[int, tuple[str, str]] = {
    0: ("PROCHOT", "thermal_hw"),
    1: ("PPT", "power_cap"),
    2: ("THERMAL_SOCKET", "thermal_sw"),  # AID, XCD or CCD temperature
    3: ("THERMAL_VR", "thermal_sw"),
    4: ("THERMAL_HBM", "thermal_sw"),
}
_THROTTLERS: dict[str, dict[int, tuple[str, str]]] = {
    "mi200": _MI200_THROTTLER,
    "mi300": _MI300_THROTTLER,
}

_VIOLATION_FLAGS: dict[str, int] = {
    "active_prochot_thrm": 0,
    "active_ppt_pwr": 1,
    "active_socket_thrm": 2,
    "active_vr_thrm": 3,
    "active_hbm_thrm": 4,
}
"""``amdsmi_get_violation_status`` flag -> its MI300 throttler bit (smu_v13_0_6_pmfw.h)."""


def asic_family(gfx_target: str) -> AsicFamily | None:
    """Return the throttle bit layout of a GPU from its gfx target, ``None`` if unknown here.

    Not yet verified on hardware.

    Args:
        gfx_target: ``amdsmi_get_gpu_asic_info(...)["target_graphics_version"]``, e.g.
            ``"gfx90a"`` (MI200), ``"gfx942"`` (MI300), ``"gfx950"`` (MI350).
    """
    if gfx_target == "gfx90a":
        return "mi200"
    if gfx_target.startswith(("gfx94", "gfx95")):
        return "mi300"
    return None


def decode_amd_throttle_status(bits: int, asic_family: AsicFamily) -> int:
    """Map an AMD throttler bitmask to the kit's throttle bits.

    Not yet verified on hardware.

    Args:
        bits: MI200: gpu_metrics ``throttle_status``; MI300: :func:`violation_throttle_bits`.
        asic_family: Which layout ``bits`` uses (:func:`asic_family`).

    Returns:
        An OR of :data:`~kit.bundle.schema.THROTTLE_BITS`; any bit not known here (a spare or
        a newer firmware's) sets ``other`` rather than reading as "not throttled".

    Raises:
        ValueError: ``bits`` is negative.
    """
    if bits < 0:
        raise ValueError(f"not a throttler bitmask: {bits}")
    out = 0
    for position, (_, kit_name) in _THROTTLERS[asic_family].items():
        if bits >> position & 1:
            out |= THROTTLE_BITS[kit_name]
            bits &= ~(1 << position)
    return out | (THROTTLE_BITS["other"] if bits else 0)


def violation_throttle_bits(status: Mapping[str, Any]) -> int | None:
    """Pack the violation API's ``active_*`` flags into MI300 throttler bits.

    Not yet verified on hardware.

    Args:
        status: What ``amdsmi_get_violation_status`` returned: each ``active_*`` flag is
            ``True``/``False``, or ``"N/A"`` where the device does not report it.

    Returns:
        The bitmask for :func:`decode_amd_throttle_status` with ``"mi300"``, or ``None`` when
        no flag is reported (MI200 and older answer N/A).
    """
    flags = {name: status.get(name, "N/A") for name in _VIOLATION_FLAGS}
    if all(isinstance(v, str) for v in flags.values()):
        return None
    return sum(1 << _VIOLATION_FLAGS[name] for name, v in flags.items() if v is True or v == 1)


# --- quirk (c): energy counter check ----------------------------------------------------------


def energy_counter_plausible(samples: Sequence[tuple[float, float, float]]) -> tuple[bool, str]:
    """Compare the energy counter's advance with power integrated over the same samples.

    Not yet verified on hardware. A healthy counter advances by about power x time; one that
    is stuck (ROCm/amdsmi#38), runs backwards (ROCm/amdsmi#115) or is scaled wrongly falls
    outside :data:`ENERGY_RATIO_RANGE`.

    Args:
        samples: ``(t_s, power_w, energy_j)`` in time order, at least two.

    Returns:
        ``(plausible, reason)``; the reason states both energies and their ratio.

    Raises:
        ValueError: Fewer than two samples.
    """
    if len(samples) < 2:
        raise ValueError("need at least two samples")
    span_s = samples[-1][0] - samples[0][0]
    expected_j = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0, _), (t1, p1, _) in pairwise(samples))
    counted_j = samples[-1][2] - samples[0][2]
    where = f"over {span_s:.3g} s ({len(samples)} samples)"
    if expected_j <= 0:
        return False, f"cannot check the energy counter: power x time is {expected_j:.3g} J {where}"
    if counted_j == 0:
        return False, (
            f"energy counter stuck: it did not advance while power x time gave "
            f"{expected_j:.3g} J {where}"
        )
    ratio = counted_j / expected_j
    lo, hi = ENERGY_RATIO_RANGE
    verdict = (
        f"energy counter advanced {counted_j:.3g} J, power x time gave {expected_j:.3g} J "
        f"{where}: ratio {ratio:.3g}"
    )
    if lo <= ratio <= hi:
        return True, f"{verdict}, within {lo}..{hi}"
    return False, f"{verdict}, outside {lo}..{hi}"


class EnergyCounterCheck:
    """Quirk (c) for one device: hold the energy counter back until it has been checked.

    Not yet verified on hardware. The first samples (at least ``min_samples`` over at least
    ``min_span_s``) are compared by :func:`energy_counter_plausible`; until then, and for the
    rest of the run if the check fails or the counter later runs backwards, the energy to
    record is ``None`` and :attr:`reason` says why.

    Args:
        min_span_s: Seconds of samples to compare.
        min_samples: Samples to compare, at least 2.

    Attributes:
        ok: ``None`` while checking, then whether the counter is trusted.
        reason: The check's verdict, or why the counter was dropped.
    """

    def __init__(
        self, min_span_s: float = ENERGY_CHECK_MIN_S, min_samples: int = ENERGY_CHECK_MIN_SAMPLES
    ) -> None:
        if min_samples < 2:
            raise ValueError("min_samples must be at least 2")
        self._min_span_s = min_span_s
        self._min_samples = min_samples
        self._window: list[tuple[float, float, float]] = []
        self._last_j: float | None = None
        self.ok: bool | None = None
        self.reason: str | None = None

    def feed(self, t: float, power_w: float | None, energy_j: float | None) -> float | None:
        """Take one sample; return the energy to record for it (``None`` when not trusted).

        Not yet verified on hardware.

        Args:
            t: Sample time, seconds.
            power_w: Power read in the same sample; samples without it are not compared.
            energy_j: The counter, joules; ``None`` when the read gave nothing.
        """
        if self.ok is False or energy_j is None:
            return None
        if self.ok is None:
            if power_w is not None:
                self._window.append((t, power_w, energy_j))
            w = self._window
            if len(w) < self._min_samples or w[-1][0] - w[0][0] < self._min_span_s:
                return None
            self.ok, self.reason = energy_counter_plausible(w)
            self._window = []
            if not self.ok:
                return None
        elif self._last_j is not None and energy_j < self._last_j:
            self.ok = False
            self.reason = (
                f"energy counter ran backwards at t={t:.3f} s ({self._last_j:.6g} J -> "
                f"{energy_j:.6g} J); dropped from then on"
            )
            return None
        self._last_j = energy_j
        return energy_j


# --- loading the library and converting its errors --------------------------------------------


@contextmanager
def _stdout_captured(sink: io.StringIO) -> Iterator[None]:
    """Send what runs inside to ``sink`` (Python prints) and to /dev/null (writes to fd 1).

    Not yet verified on hardware.

    The amdsmi package ``print()``s two lines to stdout when it cannot load libamd_smi.so
    (then raises ``KeyError: 'libamd_smi.so'``); the C library could write to fd 1 as well.
    Neither may reach the sampler's or the CLI's stdout.
    """
    sys.stdout.flush()
    saved_fd = os.dup(1)
    null_fd = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null_fd, 1)
        with redirect_stdout(sink):
            yield
    finally:
        os.dup2(saved_fd, 1)
        os.close(saved_fd)
        os.close(null_fd)


@lru_cache(maxsize=1)
def _import_amdsmi() -> tuple[ModuleType | None, str]:
    """Import ``amdsmi`` once, silently; return it, or ``None`` and what went wrong.

    Not yet verified on hardware.
    """
    printed = io.StringIO()
    try:
        with _stdout_captured(printed):
            module = importlib.import_module("amdsmi")
    # ImportError: no amdsmi package. OSError or KeyError 'libamd_smi.so': the package is
    # there but libamd_smi.so is not (it prints why, then fails on its first symbol).
    # AttributeError: libamd_smi.so lacks a symbol, i.e. is older than the package.
    except (ImportError, OSError, KeyError, AttributeError) as e:
        said = " ".join(printed.getvalue().split())
        why = f"{type(e).__name__}: {e}" + (f"; amdsmi printed: {said}" if said else "")
        logger.info("amdsmi not importable: %s", why)
        return None, why
    return module, ""


def load_amdsmi() -> ModuleType:
    """Import the ``amdsmi`` package, or say why it cannot be used here.

    Not yet verified on hardware. The import is tried once per process (later calls reuse
    the answer) and prints nothing.

    Raises:
        TelemetryNotSupportedError: amdsmi or libamd_smi.so is missing or they do not match;
            the message starts "AMD SMI library not found (libamd_smi.so)" and says the fix.
    """
    module, why = _import_amdsmi()
    if module is None:
        raise TelemetryNotSupportedError(f"{_LIBRARY_MISSING} ({why})")
    return module


_ERROR_HINTS: dict[str, tuple[type[TelemetryError], str | None]] = {
    "AMDSMI_STATUS_NOT_SUPPORTED": (TelemetryNotSupportedError, None),
    "AMDSMI_STATUS_NO_PERM": (
        TelemetryNotSupportedError,
        "permission denied: the user needs access to /dev/kfd and /dev/dri/renderD* "
        "(groups video and render)",
    ),
    "AMDSMI_STATUS_DRIVER_NOT_LOADED": (
        TelemetryNotSupportedError,
        "the amdgpu kernel driver is not loaded: check `lsmod | grep amdgpu` and dmesg",
    ),
    "AMDSMI_STATUS_INIT_ERROR": (
        TelemetryNotSupportedError,
        "AMD SMI could not initialise: check that amdgpu is loaded and /dev/kfd exists",
    ),
    "AMDSMI_STATUS_NOT_FOUND": (TelemetryNotSupportedError, None),
}
"""AMD SMI status name -> kit exception class and how to fix it; other codes become a plain
:class:`TelemetryError`. Names, not values, because amdsmi is imported lazily."""


def _describe(e: Exception) -> str:
    """One line for an AMD SMI exception (its ``str`` spans lines).

    Not yet verified on hardware.
    """
    return " ".join(str(e).split())


def _convert(smi: ModuleType, e: Exception, what: str) -> TelemetryError:
    """Turn an ``amdsmi.AmdSmiException`` into the kit's exception, saying what failed.

    Not yet verified on hardware.
    """
    code = getattr(e, "err_code", None)
    for name, (cls, hint) in _ERROR_HINTS.items():
        if code is not None and getattr(smi.amdsmi_wrapper, name, None) == code:
            return cls(f"{what}: {_describe(e)}" + (f" ({hint})" if hint else ""))
    return TelemetryError(f"{what}: {_describe(e)}")


@contextmanager
def _amdsmi_errors(smi: ModuleType, what: str) -> Iterator[None]:
    """Re-raise any ``amdsmi.AmdSmiException`` inside the block as a :class:`TelemetryError`.

    Not yet verified on hardware.
    """
    try:
        yield
    except smi.AmdSmiException as e:
        raise _convert(smi, e, what) from e


# --- reading one device -----------------------------------------------------------------------

_Reader = Callable[[], float | int | None]
"""Reads one field in canonical units; ``None`` when AMD SMI says N/A this time."""

_PACKAGE_FIELDS = ("power_w", "power_avg_w", "energy_j")
"""Fields that cover an MI250's whole package (quirk (a))."""

_SINCE_START = ("link_tx_bytes", "link_rx_bytes")
"""Cumulative counters reported relative to their first reading."""

_KIB = 1024
"""Bytes per "KiloByte" of gpu_metrics' xGMI counters (kgd_pp_interface.h says KiloBytes)."""


def _num(value: Any) -> float | None:
    """A reading as a float; ``None`` where AMD SMI marks it unsupported ("N/A" or all ones).

    Not yet verified on hardware.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or value in _ALL_ONES:
        return None
    return float(value)


def _sum_kib(values: Sequence[Any]) -> int | None:
    """Bytes in per-link KiB counters, summed over the links that report; ``None`` if none.

    Not yet verified on hardware.
    """
    read = [v for v in map(_num, values) if v is not None]
    return int(sum(read) * _KIB) if read else None


def _raw_throttle_status(smi: ModuleType, handle: Any) -> int | None:
    """MI200 gpu_metrics ``throttle_status`` with its bits; ``None`` when not reported.

    Not yet verified on hardware.

    amdsmi 7.0.2's ``amdsmi_get_gpu_metrics_info`` turns ``throttle_status`` into a bool
    (``_validate_if_max_uint(..., isBool=True)``), losing which limiter is active, so the same
    documented C call is made through the package's own ctypes binding to keep the bits.
    """
    w = smi.amdsmi_wrapper
    metrics = w.amdsmi_gpu_metrics_t()
    status = w.amdsmi_get_gpu_metrics_info(handle, ctypes.byref(metrics))
    if status != w.AMDSMI_STATUS_SUCCESS:
        raise smi.AmdSmiLibraryException(status)
    return None if metrics.throttle_status in _ALL_ONES else int(metrics.throttle_status)


def _readers(
    smi: ModuleType, h: Any, family: AsicFamily | None
) -> dict[str, tuple[str, _Reader] | str]:
    """Every canonical GPU field: ``(label, reader)`` on this device, or why there is none.

    Not yet verified on hardware.
    """
    current = smi.AmdSmiTemperatureMetric.CURRENT

    def power(key: str) -> tuple[str, _Reader]:
        # Watts (amdsmi.h, amdsmi_power_info_t): current_socket_power on MI300+,
        # average_socket_power on MI200 and older; the other reads N/A.
        return f"amdsmi_get_power_info {key}", lambda: _num(smi.amdsmi_get_power_info(h)[key])

    def energy_j() -> float | None:
        e = smi.amdsmi_get_energy_count(h)
        # energy_accumulator x counter_resolution is microjoules (AMD SMI Python API docs);
        # releases before ROCm 6.4 name the accumulator "power".
        acc = _num(e.get("energy_accumulator", e.get("power")))
        return None if acc is None else acc * float(e["counter_resolution"]) * 1e-6

    def temp(sensor: Any) -> tuple[str, _Reader]:
        return f"amdsmi_get_temp_metric {sensor.name}", lambda: _num(
            smi.amdsmi_get_temp_metric(h, sensor, current)
        )

    def clock(kind: Any) -> tuple[str, _Reader]:
        return f"amdsmi_get_clock_info {kind.name}", lambda: _num(
            smi.amdsmi_get_clock_info(h, kind)["clk"]
        )

    def xgmi(key: str) -> tuple[str, _Reader]:
        # gpu_metrics v1.4+ (MI300); MI200's v1.3 has no such counters and reads N/A.
        return f"amdsmi_get_gpu_metrics_info {key}", lambda: _sum_kib(
            smi.amdsmi_get_gpu_metrics_info(h)[key]
        )

    def used_bytes() -> int | None:
        used = _num(smi.amdsmi_get_gpu_memory_usage(h, smi.AmdSmiMemoryType.VRAM))
        return None if used is None else int(used)

    throttle: tuple[str, _Reader] | str
    if family == "mi200":
        throttle = (
            "gpu_metrics throttle_status (MI200 bits)",
            lambda: _decoded(_raw_throttle_status(smi, h), "mi200"),
        )
    elif family == "mi300":
        throttle = (
            "amdsmi_get_violation_status active_* flags",
            lambda: _decoded(violation_throttle_bits(smi.amdsmi_get_violation_status(h)), "mi300"),
        )
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
        "energy_j": ("amdsmi_get_energy_count", energy_j),
        "temp_gpu_c": temp(smi.AmdSmiTemperatureType.HOTSPOT),
        "temp_mem_c": temp(smi.AmdSmiTemperatureType.VRAM),
        "clock_sm_mhz": clock(smi.AmdSmiClkType.GFX),
        "clock_mem_mhz": clock(smi.AmdSmiClkType.MEM),
        "util_gpu_pct": (
            "amdsmi_get_gpu_activity gfx_activity",
            lambda: _num(smi.amdsmi_get_gpu_activity(h)["gfx_activity"]),
        ),
        "mem_used_bytes": ("amdsmi_get_gpu_memory_usage VRAM", used_bytes),
        "throttle": throttle,
        # gpu_metrics names the directions read and write; read data arrives at this GPU.
        "link_rx_bytes": xgmi("xgmi_read_data_acc"),
        "link_tx_bytes": xgmi("xgmi_write_data_acc"),
        "pcie_tx_bytes": no_pcie,
        "pcie_rx_bytes": no_pcie,
        "viol_power_s": no_viol,
        "viol_thermal_s": no_viol,
    }


def _decoded(bits: int | None, family: AsicFamily) -> int | None:
    """:func:`decode_amd_throttle_status`, passing ``None`` (not reported) through.

    Not yet verified on hardware.
    """
    return None if bits is None else decode_amd_throttle_status(bits, family)


def _scaled(value: Any, factor: float) -> float | None:
    """``value`` x ``factor``, or ``None`` where AMD SMI says N/A. Not yet verified on hardware."""
    number = _num(value)
    return None if number is None else number * factor


@dataclass
class _Device:
    """One GPU: its handle, what it is, how each readable field is read, what each field is.

    Not yet verified on hardware.
    """

    index: int
    handle: Any
    name: str
    die: Mi250Die | None
    reads: dict[str, _Reader] = field(default_factory=dict)
    baselines: dict[str, float] = field(default_factory=dict)
    info: dict[str, FieldInfo] = field(default_factory=dict)
    energy_check: EnergyCounterCheck | None = None
    check_power: str | None = None
    energy_note: str = ""


def _with_unverified(reason: str | None) -> str:
    """``reason`` followed by :data:`NOT_VERIFIED`.

    Not yet verified on hardware.
    """
    return f"{reason}; {NOT_VERIFIED}" if reason else NOT_VERIFIED


class AmdSmiSource(TelemetrySource):
    """One ``gpu`` row per AMD GPU per tick, read through AMD SMI; not yet verified on hardware.

    Args:
        node: Node index written into every row.
        devices: AMD SMI device indices to sample (see the module docstring on index order);
            ``None`` samples every GPU of the node. Rows carry these indices as ``device``.

    Raises:
        TelemetryNotSupportedError: amdsmi or libamd_smi.so is missing ("AMD SMI library not
            found"), AMD SMI does not start (no driver, permissions; the message says how to
            fix it), the node has no GPU, or ``devices`` names one that does not exist.
        TelemetryError: AMD SMI failed otherwise while opening a device.
    """

    name = "amdsmi"

    def __init__(self, node: int, devices: list[int] | None = None) -> None:
        smi = load_amdsmi()
        self._smi = smi
        self._node = node
        with _amdsmi_errors(smi, "AMD SMI did not start (amdsmi_init)"):
            smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
        try:
            with _amdsmi_errors(smi, "amdsmi_get_processor_handles"):
                handles = smi.amdsmi_get_processor_handles()
            wanted = list(range(len(handles))) if devices is None else list(devices)
            if not wanted or any(not 0 <= i < len(handles) for i in wanted):
                raise TelemetryNotSupportedError(
                    f"AMD SMI sees {len(handles)} GPU(s) on this node; cannot sample devices "
                    f"{wanted}"
                )
            self._devices = [self._open(i, handles[i]) for i in wanted]
            self._facts = [self._static_facts(d) for d in self._devices]
        except BaseException:
            with suppress(smi.AmdSmiException):
                smi.amdsmi_shut_down()
            raise
        self._closed = False

    def _open(self, index: int, handle: Any) -> _Device:
        """Identify the device and find, once, how each field is read on it.

        Not yet verified on hardware.
        """
        with _amdsmi_errors(self._smi, f"device {index} amdsmi_get_gpu_asic_info"):
            asic = self._smi.amdsmi_get_gpu_asic_info(handle)
        market_name = str(asic["market_name"])
        dev = _Device(index, handle, market_name, mi250_die(index, market_name))
        family = asic_family(str(asic["target_graphics_version"]))
        for column, how in _readers(self._smi, handle, family).items():
            dev.info[column] = self._adopt(dev, column, how)
        self._setup_energy_check(dev)
        return dev

    def _adopt(self, dev: _Device, name: str, how: tuple[str, _Reader] | str) -> FieldInfo:
        """Use ``how`` for field ``name`` if it reads on ``dev``; else say why not.

        Not yet verified on hardware.
        """
        if isinstance(how, str):
            return FieldInfo(False, how)
        label, read = how
        try:
            value = read()
        except self._smi.AmdSmiException as e:
            return FieldInfo(False, f"{label}: {_describe(e)}")
        if value is None:
            return FieldInfo(False, f"{label}: AMD SMI reports N/A on this device")
        note = f"read from {label}"
        if name in _PACKAGE_FIELDS:
            attributed, package_note = attribute_package_power(dev.die, float(value))
            if attributed is None:
                return FieldInfo(False, package_note)
            note = f"{note}; {package_note}" if package_note else note
        if name.startswith("temp_") and value > MAX_PLAUSIBLE_TEMP_C:
            return FieldInfo(False, f"{label} read {value}, not a temperature in deg C")
        if name in _SINCE_START:
            dev.baselines[name] = value
        dev.reads[name] = read
        return FieldInfo(True, note)

    def _setup_energy_check(self, dev: _Device) -> None:
        """Quirk (c): hold the energy counter back until it agrees with power x time.

        Not yet verified on hardware.
        """
        if "energy_j" not in dev.reads:
            return
        dev.check_power = next((p for p in ("power_w", "power_avg_w") if p in dev.reads), None)
        if dev.check_power is None:
            del dev.reads["energy_j"]
            dev.info["energy_j"] = FieldInfo(
                False, "energy counter not used: no power reading on this device to check it"
            )
            return
        dev.energy_check = EnergyCounterCheck()
        dev.energy_note = str(dev.info["energy_j"].reason)
        dev.info["energy_j"] = FieldInfo(
            True,
            f"{dev.energy_note}; null until checked against {dev.check_power} x time over "
            f"the first {ENERGY_CHECK_MIN_S:g} s",
        )

    def _static_facts(self, dev: _Device) -> dict[str, Any]:
        """Read the facts :meth:`devices` reports; one AMD SMI cannot read is left out.

        Not yet verified on hardware.
        """
        smi, h = self._smi, dev.handle
        reads: dict[str, Callable[[], Any]] = {
            "uuid": lambda: smi.amdsmi_get_gpu_device_uuid(h),
            # power_cap in microwatts (AMD SMI Python API docs, amdsmi_get_power_cap_info)
            "power_limit_w": lambda: _scaled(smi.amdsmi_get_power_cap_info(h)["power_cap"], 1e-6),
            "clock_sm_max_mhz": lambda: _num(
                smi.amdsmi_get_clock_info(h, smi.AmdSmiClkType.GFX)["max_clk"]
            ),
            "memory_total_bytes": lambda: _scaled(
                smi.amdsmi_get_gpu_memory_total(h, smi.AmdSmiMemoryType.VRAM), 1
            ),
        }
        facts: dict[str, Any] = {"device": dev.index, "name": dev.name}
        for key, read in reads.items():
            try:
                value = read()
            except smi.AmdSmiException as e:
                logger.info("AMD SMI device %d: %s unreadable: %s", dev.index, key, e)
                continue
            if value is not None:
                facts[key] = int(value) if key == "memory_total_bytes" else value
        if dev.die is not None:
            facts.update(package=dev.die.package, die=dev.die.die)
        return facts

    def fields(self) -> dict[str, FieldInfo]:
        """Return each GPU field's readability over all devices; not yet verified on hardware.

        A field is readable when at least one device reads it (the others write ``None``).
        ``reason`` names, per group of devices, how the field is read or why it is not, and
        always ends with "not yet verified on hardware". ``energy_j`` turns unreadable, with
        the check's verdict, on a device whose counter failed quirk (c)'s check.
        """
        out: dict[str, FieldInfo] = {}
        for name in self._devices[0].info:
            by_reason: dict[str, list[int]] = {}
            for d in self._devices:
                by_reason.setdefault(str(d.info[name].reason), []).append(d.index)
            text = "; ".join(
                f"device {','.join(map(str, idx))}: {r}" for r, idx in by_reason.items()
            )
            readable = any(d.info[name].readable for d in self._devices)
            out[name] = FieldInfo(readable, _with_unverified(text))
        return out

    def devices(self) -> list[dict[str, Any]]:
        """Name, UUID, power cap, max GFX clock, VRAM size and, on MI250, package and die.

        Not yet verified on hardware.
        """
        return list(self._facts)

    def _read(self, dev: _Device, t: float) -> dict[str, Any]:
        """Read every readable field of one device, in canonical units.

        Not yet verified on hardware.
        """
        values: dict[str, Any] = {}
        for name, read in dev.reads.items():
            value = read()
            if value is not None and name in dev.baselines:
                value = int(value - dev.baselines[name])
            values[name] = value
        check = dev.energy_check
        if check is not None and dev.check_power is not None:
            was = check.ok
            values["energy_j"] = check.feed(t, values.get(dev.check_power), values["energy_j"])
            if check.ok is not was:
                why = f"{dev.energy_note}; {check.reason}" if check.ok else check.reason
                dev.info["energy_j"] = FieldInfo(bool(check.ok), why)
            if check.ok is False:
                del dev.reads["energy_j"]
                dev.energy_check = None
        return values

    def sample(self, t: float) -> list[dict[str, Any]]:
        """Read every device once; see :meth:`TelemetrySource.sample`.

        Not yet verified on hardware.

        Raises:
            TelemetryError: An AMD SMI read that worked at construction failed (e.g. the GPU
                was reset); the message names the device.
        """
        rows = []
        for dev in self._devices:
            with _amdsmi_errors(self._smi, f"device {dev.index}"):
                values = self._read(dev, t)
            rows.append(make_row(t, self._node, dev.index, "gpu", **values))
        return rows

    def close(self) -> None:
        """Shut AMD SMI down; never raises, since the sampler calls it on a failed source too.

        Not yet verified on hardware.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._smi.amdsmi_shut_down()
        except self._smi.AmdSmiException as e:
            logger.warning("amdsmi_shut_down failed: %s", e)
