"""AMD GPU telemetry through AMD SMI (ROCm's ``amdsmi`` package): not yet verified on hardware.

Written against AMD SMI's own sources with no AMD GPU reachable: the Python package of
releases 6.1.2, 6.3.3 and 7.0.2 (``amdsmi_interface.py``, ``amdsmi_exception.py``,
``amdsmi_wrapper.py``), the C library and ``rocm_smi.py`` of ROCm/amdsmi, and the amdgpu kernel
driver's headers; ``docs/telemetry-amd.md`` lists what was checked where. Every reason this
backend gives, in :meth:`AmdSmiSource.fields` and so in every bundle that uses it, says "not yet
verified on hardware".

Per device and tick it makes each AMD SMI call once: socket power
(``amdsmi_get_power_info``), the energy accumulator (``amdsmi_get_energy_count``), hotspot and
VRAM temperature (``amdsmi_get_temp_metric``), GFX and memory clocks
(``amdsmi_get_clock_info``), GFX activity (``amdsmi_get_gpu_activity``), VRAM used
(``amdsmi_get_gpu_memory_usage``) and gpu_metrics (``amdsmi_get_gpu_metrics_info``: xGMI data
counters, MI300 throttle residency). It never calls ``amdsmi_get_violation_status``, which
sleeps 100 ms per device inside the library.

AMD SMI 6.1 and newer are read field by field: where a release lacks a key or a function
(6.1: no ``target_graphics_version``, ``cur_clk`` for ``clk``, ``power`` for
``energy_accumulator``, no residency counters), that field is null with the reason. An older
package, missing the calls every field needs, is refused in one line naming the minimum.

Failures are per device and per field. A read that fails with a status AMD SMI defines as
transient (RETRY, BUSY, TIMEOUT) gives ``None`` for that tick and is retried on the next; any
other failure drops that field of that device for the rest of the run, and a device with no
field left stops giving rows. Each loss is named, with its time, by :meth:`AmdSmiSource.fields`
called at the end of the run. ``temp_gpu_c`` is the hotspot (junction) sensor: what the SMU's
thermal throttler acts on, and MI300's gpu_metrics has no edge temperature at all.

Device indices are AMD SMI's (its processor handles, in PCI bus order), which can differ from
HIP's; match ranks to devices by the UUIDs in :meth:`AmdSmiSource.devices`. The hardware quirks
(MI250 package power, throttle layouts, the energy counter check and unit) are in
:mod:`kit.telemetry.amd.quirks`.
"""

import ctypes
import importlib
import io
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, redirect_stdout, suppress
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from kit.telemetry.amd.quirks import (
    ENERGY_CHECK_MIN_S,
    AsicFamily,
    EnergyCounterCheck,
    Mi250Die,
    ResidencyThrottle,
    asic_family,
    decode_amd_throttle_status,
    energy_unit_j,
    gfx_target_from_name,
    is_mi250,
    mi250_dies,
    mi250_is_secondary,
    package_share,
)
from kit.telemetry.base import (
    FieldInfo,
    TelemetryError,
    TelemetryNotSupportedError,
    TelemetrySource,
    by_device,
    vendor_error,
    vendor_errors,
)
from kit.telemetry.counters import WrappingCounter, describe_events
from kit.telemetry.fields import make_row

logger = logging.getLogger(__name__)

NOT_VERIFIED = "not yet verified on hardware"
"""Appended to every reason this backend reports, until an AMD GPU run has checked it."""

MIN_VERSION = "6.1"
"""The oldest AMD SMI (ROCm) release whose Python API this backend was checked against."""

REQUIRED_API = (
    "amdsmi_init", "amdsmi_shut_down", "amdsmi_get_processor_handles",
    "amdsmi_get_gpu_asic_info", "amdsmi_get_power_info", "amdsmi_get_energy_count",
    "amdsmi_get_temp_metric", "amdsmi_get_clock_info", "amdsmi_get_gpu_activity",
    "amdsmi_get_gpu_memory_usage", "amdsmi_get_gpu_metrics_info", "AmdSmiException",
    "AmdSmiLibraryException", "AmdSmiInitFlags", "AmdSmiTemperatureType",
    "AmdSmiTemperatureMetric", "AmdSmiClkType", "AmdSmiMemoryType",
)
"""What every AMD SMI from 6.1 on has, and this backend cannot do without."""

TRANSIENT_STATUSES = ("AMDSMI_STATUS_RETRY", "AMDSMI_STATUS_BUSY", "AMDSMI_STATUS_TIMEOUT")
"""Statuses after which a read is retried on the next tick (AMD SMI's docs:
``AmdSmiRetryException`` "signals device is busy and call should be retried")."""

MAX_PLAUSIBLE_TEMP_C = 200.0
"""A first temperature above this is not in deg C: amdsmi.h says ``amdsmi_get_temp_metric``
returns degrees C, AMD SMI's Python docs say millidegrees; such a sensor is not used."""

_LIBRARY_MISSING = (
    "AMD SMI library not found (libamd_smi.so): install ROCm's amd-smi-lib and the amdsmi "
    "Python package of the same ROCm release, or set ROCM_PATH to the ROCm install"
)

_ALL_ONES = frozenset({0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})
"""Sentinels AMD SMI leaves in a numeric field the device does not support (only some are
turned into "N/A" by the Python layer, e.g. power only at 0xFFFF)."""

_KIB = 1024
"""Bytes per "KiloByte" of gpu_metrics' xGMI counters (kgd_pp_interface.h says KiloBytes)."""

_PACKAGE_FIELDS = ("power_w", "power_avg_w", "energy_j")
"""Fields that cover an MI250's whole package (quirk (a))."""

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


def load_amdsmi() -> ModuleType:
    """Import the ``amdsmi`` package, or say why it cannot be used here.

    Not yet verified on hardware. The import prints nothing. A failed import is tried again on
    the next call (Python keeps a module only once it imported), which happens once per source.

    Raises:
        TelemetryNotSupportedError: amdsmi or libamd_smi.so is missing or they do not match
            (the message starts "AMD SMI library not found (libamd_smi.so)" and says the fix),
            or the package is older than :data:`MIN_VERSION` (the message names it).
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
        raise TelemetryNotSupportedError(f"{_LIBRARY_MISSING} ({why})") from None
    missing = [name for name in REQUIRED_API if not hasattr(module, name)]
    if missing:
        raise TelemetryNotSupportedError(
            f"amdsmi {amdsmi_version(module)} lacks {', '.join(missing)}: the amdsmi backend "
            f"needs AMD SMI {MIN_VERSION} (ROCm {MIN_VERSION}) or newer"
        )
    return module


def amdsmi_version(smi: ModuleType) -> str:
    """The amdsmi package's release (``amdsmi.__version__``, e.g. "6.3.3").

    Not yet verified on hardware. "(unknown version)" when the package has none (ROCm 5.x).
    """
    return str(getattr(smi, "__version__", "(unknown version)"))


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


def _status_is(smi: ModuleType, e: Exception, names: Sequence[str]) -> bool:
    """Whether AMD SMI exception ``e`` carries one of the named statuses.

    Not yet verified on hardware.
    """
    code = getattr(e, "err_code", None)
    return code is not None and any(
        getattr(smi.amdsmi_wrapper, name, None) == code for name in names
    )


def _convert(smi: ModuleType, e: Exception, what: str) -> TelemetryError:
    """Turn an ``amdsmi.AmdSmiException`` into the kit's exception, saying what failed.

    Not yet verified on hardware.
    """
    return vendor_error(what, _describe(e), lambda name: _status_is(smi, e, [name]),
                        _ERROR_HINTS)


def _amdsmi_errors(smi: ModuleType, what: str) -> AbstractContextManager[None]:
    """Re-raise any ``amdsmi.AmdSmiException`` inside the block as a :class:`TelemetryError`.

    Not yet verified on hardware.
    """
    return vendor_errors(smi.AmdSmiException, lambda e: _convert(smi, e, what))


# --- reading one device -----------------------------------------------------------------------


def _num(value: Any) -> float | None:
    """A reading as a float; ``None`` where AMD SMI marks it unsupported ("N/A" or all ones).

    Not yet verified on hardware.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or value in _ALL_ONES:
        return None
    return float(value)


def _key(answer: dict[str, Any], *names: str) -> Any:
    """The first of ``names`` present in an AMD SMI answer (releases rename keys).

    Not yet verified on hardware.

    Raises:
        KeyError: None of them is there; the message names them.
    """
    for name in names:
        if name in answer:
            return answer[name]
    raise KeyError(" or ".join(names))


class _Tick:
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


_Reader = Callable[[_Tick], float | int | None]
"""Reads one field in canonical units; ``None`` when AMD SMI says N/A this time."""


class _Xgmi:
    """An xGMI data counter: bytes since the first read, summed over links.

    Not yet verified on hardware. Each link is unwrapped on its own.

    gpu_metrics v1.4+ (MI300) has per-link ``xgmi_read_data_acc`` / ``xgmi_write_data_acc``
    in KiB, 64-bit: a drop is a reset, not a wrap. MI200's v1.3 has none and reads N/A.
    """

    def __init__(self, metrics: Callable[[_Tick], dict[str, Any]], key: str) -> None:
        self._metrics = metrics
        self._key = key
        self._links: dict[int, WrappingCounter] = {}

    def __call__(self, tick: _Tick) -> int | None:
        """Bytes since the first read; ``None`` when no link reports or one reset.

        Not yet verified on hardware.
        """
        reset = False
        for link, kib in enumerate(self._metrics(tick)[self._key]):
            if _num(kib) is not None:
                counter = self._links.setdefault(link, WrappingCounter(None))
                reset |= counter.update(kib, tick.t) is None
        if reset or not self._links:
            return None
        return int(sum(c.advance for c in self._links.values()) * _KIB)

    def events(self) -> str | None:
        """The links' resets, in one sentence. Not yet verified on hardware."""
        return describe_events(list(self._links.values()), f"gpu_metrics {self._key}")


class _Mi300Throttle:
    """MI300+ throttle reasons from gpu_metrics residency counters (quirk (b)).

    Not yet verified on hardware.
    """

    def __init__(self, metrics: Callable[[_Tick], dict[str, Any]]) -> None:
        self._metrics = metrics
        self._residency = ResidencyThrottle()

    def probe(self, tick: _Tick) -> float | None:
        """The accumulation counter, to see the counters exist; primes the first interval.

        Not yet verified on hardware.
        """
        metrics = self._metrics(tick)
        self._residency.update(metrics, tick.t)
        return _num(metrics["accumulation_counter"])

    def __call__(self, tick: _Tick) -> int | None:
        """The kit's throttle bits over the last interval. Not yet verified on hardware."""
        bits = self._residency.update(self._metrics(tick), tick.t)
        return None if bits is None else decode_amd_throttle_status(bits, "mi300")

    def events(self) -> str | None:
        """The residency counters' wraps. Not yet verified on hardware."""
        return self._residency.describe_events()


class _Energy:
    """The energy accumulator in joules: exact unit, unwrapped, and checked (quirks (c), (d)).

    Not yet verified on hardware.

    Args:
        read_raw: Returns ``amdsmi_get_energy_count``'s dict.
        power: Reads the power that vouches for the counter, in the same tick.
        gfx_target: The device's gfx target, when known (for the unit).
    """

    def __init__(self, read_raw: Callable[[_Tick], dict[str, Any]], power: _Reader,
                 gfx_target: str | None) -> None:
        self._read_raw = read_raw
        self._power = power
        self._gfx_target = gfx_target
        self._counter = WrappingCounter(None)  # amdsmi's energy_accumulator is uint64
        self._first: float | None = None
        self.unit_j: float | None = None
        self.unit_note = ""
        self.check = EnergyCounterCheck()

    def _raw(self, tick: _Tick) -> float | None:
        """The raw accumulator; the first answer also fixes the unit.

        Not yet verified on hardware.
        """
        answer = self._read_raw(tick)
        if self.unit_j is None:
            self.unit_j, self.unit_note = energy_unit_j(
                self._gfx_target, float(answer["counter_resolution"]))
        # releases before 6.3 name the accumulator "power"; 6.3 has both, 7.0 only the new name
        return _num(_key(answer, "energy_accumulator", "power"))

    def _unwrapped(self, raw: float, t: float) -> float | None:
        """Counts since the driver started, unwrapped; ``None`` on a reset.

        Not yet verified on hardware.
        """
        if self._first is None:
            self._first = raw
        advance = self._counter.update(raw, t)
        return None if advance is None else self._first + advance

    def probe(self, tick: _Tick) -> float | None:
        """The raw accumulator, also its first reading. Not yet verified on hardware."""
        raw = self._raw(tick)
        if raw is not None:
            self._unwrapped(raw, tick.t)
        return raw

    def __call__(self, tick: _Tick) -> float | None:
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


def _readers(
    smi: ModuleType, h: Any, family: AsicFamily | None, gfx_target: str | None
) -> dict[str, tuple[str, _Reader] | str]:
    """Every canonical GPU field: ``(label, reader)`` on this device, or why there is none.

    Not yet verified on hardware.
    """
    current = smi.AmdSmiTemperatureMetric.CURRENT

    def metrics(tick: _Tick) -> dict[str, Any]:
        return tick.get("gpu_metrics", lambda: smi.amdsmi_get_gpu_metrics_info(h))

    def power(key: str) -> tuple[str, _Reader]:
        # Watts (amdsmi.h, amdsmi_power_info_t): current_socket_power on MI300+,
        # average_socket_power on MI200 and older; the other reads N/A.
        return f"amdsmi_get_power_info {key}", lambda tick: _num(
            tick.get("power_info", lambda: smi.amdsmi_get_power_info(h))[key])

    def temp(sensor: Any) -> tuple[str, _Reader]:
        return f"amdsmi_get_temp_metric {sensor.name}", lambda tick: _num(
            tick.get(f"temp {sensor.name}", lambda: smi.amdsmi_get_temp_metric(h, sensor, current))
        )

    def clock(kind: Any) -> tuple[str, _Reader]:
        # "clk" from 6.2 on; 6.1 names it "cur_clk"
        return f"amdsmi_get_clock_info {kind.name}", lambda tick: _num(_key(
            tick.get(f"clock {kind.name}", lambda: smi.amdsmi_get_clock_info(h, kind)),
            "clk", "cur_clk"))

    def used_bytes(tick: _Tick) -> int | None:
        used = _num(tick.get("vram", lambda: smi.amdsmi_get_gpu_memory_usage(
            h, smi.AmdSmiMemoryType.VRAM)))
        return None if used is None else int(used)

    def check_power(tick: _Tick) -> float | None:
        info = tick.get("power_info", lambda: smi.amdsmi_get_power_info(h))
        return next((p for p in map(_num, (info.get("current_socket_power"),
                                           info.get("average_socket_power"))) if p is not None),
                    None)

    throttle: tuple[str, _Reader] | str
    if family == "mi200":
        throttle = (
            "gpu_metrics throttle_status (MI200 bits)",
            lambda tick: _decoded(tick.get("raw_throttle", lambda: _raw_throttle_status(smi, h))),
        )
    elif family == "mi300":
        throttle = ("gpu_metrics accumulation_counter and *_residency_acc, differenced between "
                    "ticks (what amdsmi_get_violation_status computes, without its 100 ms sleep)",
                    _Mi300Throttle(metrics))
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
        "energy_j": ("amdsmi_get_energy_count", _Energy(
            lambda tick: tick.get("energy", lambda: smi.amdsmi_get_energy_count(h)),
            check_power, gfx_target)),
        "temp_gpu_c": temp(smi.AmdSmiTemperatureType.HOTSPOT),
        "temp_mem_c": temp(smi.AmdSmiTemperatureType.VRAM),
        "clock_sm_mhz": clock(smi.AmdSmiClkType.GFX),
        "clock_mem_mhz": clock(smi.AmdSmiClkType.MEM),
        "util_gpu_pct": (
            "amdsmi_get_gpu_activity gfx_activity",
            lambda tick: _num(tick.get("activity", lambda: smi.amdsmi_get_gpu_activity(h))[
                "gfx_activity"]),
        ),
        "mem_used_bytes": ("amdsmi_get_gpu_memory_usage VRAM", used_bytes),
        "throttle": throttle,
        # gpu_metrics names the directions read and write; read data arrives at this GPU.
        "link_rx_bytes": ("amdsmi_get_gpu_metrics_info xgmi_read_data_acc",
                          _Xgmi(metrics, "xgmi_read_data_acc")),
        "link_tx_bytes": ("amdsmi_get_gpu_metrics_info xgmi_write_data_acc",
                          _Xgmi(metrics, "xgmi_write_data_acc")),
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


@dataclass
class _Field:
    """How one canonical field is read on one device, and what became of it.

    Not yet verified on hardware.

    Attributes:
        read: The reader; ``None`` when the field is not read on this device.
        note: How it is read, or why it is not.
        probed: What the first read, at construction, gave (raw for the energy counter).
        wrote: Whether a value reached a row.
        lost: Why and when it stopped being read, if it did.
        retries: Transient failures so far, and the first one's time and status.
    """

    read: _Reader | None
    note: str
    probed: float | None = None
    wrote: bool = False
    lost: str | None = None
    retries: int = 0
    first_retry: str = ""

    def describe(self) -> tuple[bool, str]:
        """Whether the field gave (or can give) values on this device, and what to say.

        Not yet verified on hardware.
        """
        parts = [self.note]
        events = getattr(self.read, "events", None)
        parts.append(events() if events else None)
        if self.retries:
            parts.append(f"{self.retries} transient failure(s), each retried on the next tick; "
                         f"the first {self.first_retry}")
        parts.append(self.lost)
        energy = self.read if isinstance(self.read, _Energy) else None
        untrusted = energy is not None and energy.check.ok is False
        readable = self.read is not None and (self.wrote or (not self.lost and not untrusted))
        return readable, "; ".join(p for p in parts if p)


@dataclass
class _Device:
    """One GPU: its handle, what it is, and each field's reader and state.

    Not yet verified on hardware.
    """

    index: int
    handle: Any
    name: str
    gfx_target: str | None
    gfx_note: str
    fields: dict[str, _Field] = field(default_factory=dict)
    die: Mi250Die | None = None

    def live(self) -> bool:
        """Whether any field is still read. Not yet verified on hardware."""
        return any(f.read is not None and not f.lost for f in self.fields.values())


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
            found") or older than 6.1, AMD SMI does not start (no driver, permissions; the
            message says how to fix it), the node has no GPU, ``devices`` names one that does
            not exist, or no device could be opened.
        TelemetryError: AMD SMI failed otherwise while listing the devices.
    """

    name = "amdsmi"
    reads_devices = True

    @classmethod
    def probe(cls) -> tuple[str, ...]:
        """The AMD GPUs AMD SMI lists (empty without the ROCm driver or amdsmi)."""
        if not os.path.exists("/dev/kfd"):  # no AMD GPU driver: skip amdsmi, which prints noise
            return ()
        try:
            import amdsmi

            amdsmi.amdsmi_init()
            try:
                return tuple(
                    str(amdsmi.amdsmi_get_gpu_asic_info(h).get("market_name", "AMD GPU"))
                    for h in amdsmi.amdsmi_get_processor_handles()
                )
            finally:
                amdsmi.amdsmi_shut_down()
        except (Exception, KeyError) as e:  # noqa: BLE001 - KeyError 'libamd_smi.so' w/o ROCm
            logger.debug("AMD SMI not usable: %r", e)
            return ()

    def __init__(self, node: int, devices: list[int] | None = None) -> None:
        smi = load_amdsmi()
        self._smi = smi
        self._node = node
        self._version = amdsmi_version(smi)
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
            self._unopened: dict[int, str] = {}
            self._devices = [d for i in wanted if (d := self._open(i, handles[i]))]
            if not self._devices:
                raise TelemetryNotSupportedError(
                    "no AMD GPU could be opened: " + "; ".join(
                        f"device {i}: {why}" for i, why in self._unopened.items()))
            self._place_mi250_dies()
            self._facts = [self._static_facts(d) for d in self._devices]
        except BaseException:
            with suppress(smi.AmdSmiException):
                smi.amdsmi_shut_down()
            raise
        self._closed = False

    def _open(self, index: int, handle: Any) -> _Device | None:
        """Identify the device and find, once, how each field is read on it.

        Returns ``None`` (and keeps the reason) when even its identity cannot be read.

        Not yet verified on hardware.
        """
        smi = self._smi
        try:
            asic = smi.amdsmi_get_gpu_asic_info(handle)
        except smi.AmdSmiException as e:
            self._unopened[index] = f"amdsmi_get_gpu_asic_info: {_describe(e)}"
            return None
        name = str(asic.get("market_name", "N/A"))
        gfx = asic.get("target_graphics_version")
        if isinstance(gfx, str) and gfx.startswith("gfx"):
            gfx_target, gfx_note = gfx, "from amdsmi_get_gpu_asic_info"
        else:
            gfx_target = gfx_target_from_name(name)
            gfx_note = (f"from the market name (amdsmi {self._version} has no "
                        "target_graphics_version)")
        dev = _Device(index, handle, name, gfx_target, gfx_note)
        family = asic_family(gfx_target) if gfx_target else None
        tick = _Tick(smi, time.time())
        for column, how in _readers(smi, handle, family, gfx_target).items():
            dev.fields[column] = self._adopt(column, how, tick)
        return dev

    def _adopt(self, name: str, how: tuple[str, _Reader] | str, tick: _Tick) -> _Field:
        """Use ``how`` for field ``name`` if it reads on this device; else say why not.

        Not yet verified on hardware.
        """
        if isinstance(how, str):
            return _Field(None, how)
        label, read = how
        probe = getattr(read, "probe", read)
        try:
            value = probe(tick)
        except self._smi.AmdSmiException as e:
            if _status_is(self._smi, e, TRANSIENT_STATUSES):
                return _Field(read, f"read from {label} (its first read answered "
                                    f"{_describe(e)}; retried every tick)")
            return _Field(None, f"{label}: {_describe(e)}")
        except KeyError as e:
            return _Field(None, f"{label}: amdsmi {self._version} returns no {e} (checked "
                                f"against AMD SMI 6.1.2, 6.3.3, 7.0.2)")
        if value is None:
            return _Field(None, f"{label}: AMD SMI reports N/A on this device")
        if name.startswith("temp_") and value > MAX_PLAUSIBLE_TEMP_C:
            return _Field(None, f"{label} read {value}, not a temperature in deg C")
        return _Field(read, f"read from {label}", probed=value)

    def _place_mi250_dies(self) -> None:
        """Quirk (a): decide each MI250 package's primary from its first readings.

        The package's power and energy are then read on the primary alone.

        Not yet verified on hardware.
        """
        observed = {
            d.index: mi250_is_secondary(
                d.fields["energy_j"].probed,
                next((f.probed for p in ("power_w", "power_avg_w")
                      if (f := d.fields[p]).probed is not None), None))
            for d in self._devices if is_mi250(d.name)
        }
        dies = mi250_dies(observed)
        for d in self._devices:
            d.die = dies.get(d.index)
            for name in _PACKAGE_FIELDS:
                f = d.fields[name]
                if f.read is None or d.die is None:
                    continue
                kept, note = package_share(d.die)
                f.note = f"{f.note}; {note}" if kept else note
                f.read = f.read if kept else None
            self._setup_energy(d)

    def _setup_energy(self, dev: _Device) -> None:
        """Quirk (c): the energy counter needs a power reading to vouch for it.

        Not yet verified on hardware.
        """
        f = dev.fields["energy_j"]
        if f.read is None:
            return
        if all(dev.fields[p].read is None for p in ("power_w", "power_avg_w")):
            f.read = None
            f.note = "energy counter not used: no power reading on this device to check it"
            return
        f.note = (f"{f.note}; null until checked against power x time over the first "
                  f"{ENERGY_CHECK_MIN_S:g} s")

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
        facts: dict[str, Any] = {"device": dev.index, "name": dev.name,
                                 "amdsmi_version": self._version}
        if dev.gfx_target:
            facts["gfx_target"] = f"{dev.gfx_target} ({dev.gfx_note})"
        for key, read in reads.items():
            try:
                value = read()
            except (smi.AmdSmiException, AttributeError, KeyError) as e:
                logger.info("AMD SMI device %d: %s unreadable: %s", dev.index, key, e)
                continue
            if value is not None:
                facts[key] = int(value) if key == "memory_total_bytes" else value
        if dev.die is not None:
            facts.update(package=dev.die.package, die=dev.die.die,
                         die_evidence=f"{dev.die.evidence}; {NOT_VERIFIED}")
        return facts

    def fields(self) -> dict[str, FieldInfo]:
        """Return each GPU field's readability over all devices; not yet verified on hardware.

        A field is readable when at least one device reads it (the others write ``None``).
        ``reason`` names, per group of devices, how the field is read or why it is not, and
        always ends with "not yet verified on hardware". Called again at the end of a run it
        gives the final verdicts: the energy counter check, counter wraps and resets, transient
        failures retried, and every field lost mid-run, with its time.
        """
        out: dict[str, FieldInfo] = {}
        for name in self._devices[0].fields:
            verdicts = [(d.index, *d.fields[name].describe()) for d in self._devices]
            text = by_device([(i, text) for i, _, text in verdicts]
                             + [(i, f"not opened: {why}") for i, why in self._unopened.items()])
            out[name] = FieldInfo(any(ok for _, ok, _ in verdicts), _with_unverified(text))
        return out

    def devices(self) -> list[dict[str, Any]]:
        """Name, UUID, power cap, max GFX clock, VRAM size, gfx target and amdsmi release.

        Not yet verified on hardware. On MI250 also the package and die observed, and why.
        """
        return list(self._facts)

    def _read(self, dev: _Device, t: float) -> dict[str, Any]:
        """Read every live field of one device, in canonical units; keep each failure.

        Not yet verified on hardware.
        """
        smi = self._smi
        tick = _Tick(smi, t)
        values: dict[str, Any] = {}
        for name, f in dev.fields.items():
            if f.read is None or f.lost:
                continue
            try:
                value = f.read(tick)
            except smi.AmdSmiException as e:
                if not _status_is(smi, e, TRANSIENT_STATUSES):
                    f.lost = f"lost at t={t:.3f}: {_describe(e)}"
                    continue
                f.retries += 1
                f.first_retry = f.first_retry or f"at t={t:.3f}: {_describe(e)}"
                value = None
            except KeyError as e:
                f.lost = f"lost at t={t:.3f}: amdsmi {self._version} returned no {e}"
                continue
            f.wrote |= value is not None
            values[name] = value
        return values

    def sample(self, t: float) -> list[dict[str, Any]]:
        """Read every device once; see :meth:`TelemetrySource.sample`.

        Not yet verified on hardware. Never raises for a device's failure: a failed field of a
        device is null from then on (or retried, if transient), and a device with no field
        left gives no more rows; :meth:`fields` says what was lost when.
        """
        rows = []
        for dev in self._devices:
            if dev.live():
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


def _scaled(value: Any, factor: float) -> float | None:
    """``value`` x ``factor``, or ``None`` where AMD SMI says N/A. Not yet verified on hardware."""
    number = _num(value)
    return None if number is None else number * factor
