"""NVIDIA GPU telemetry through NVML (the ``pynvml`` module of nvidia-ml-py).

Per device and tick, one ``nvmlDeviceGetFieldValues`` call reads the fast field-value
counters (instant and average power, memory temperature) and one call each reads GPU
temperature, clocks, utilisation, memory and throttle reasons. The slow queries
(:data:`SLOW_FIELDS`: the energy counter, PCIe and per-link NVLink byte counters, violation
times; 1-13 ms per device each on H200) are read at most every :data:`SLOW_READ_MS`, in a
field-values request per field; rows between carry ``None`` for them. Measured on
2 x H200: reading them every 20 ms tick took 68 ms per tick, and the sampler, then making one
combined 41-entry request per device, died in an NVML read under a NCCL run; that request is the
suspect (``benchmarks/telemetry/results/h200x2-sampler-crash.md``), not yet re-tested on 2 GPUs.
Which counters a device has is found once, at construction: a field the
device or driver cannot read stays ``None`` in its rows, with NVML's error as the reason.

Device indices are NVML's: every GPU of the node in NVML's (nvidia-smi's) order, regardless
of ``CUDA_VISIBLE_DEVICES``. CUDA's default order (fastest first) can differ from it, so match
ranks to devices by the UUIDs in :meth:`NvmlSource.devices`, or run with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``.

Cumulative counters (energy, PCIe and NVLink bytes, violation times) go through
:class:`~kit.telemetry.counters.WrappingCounter`, each NVLink link on its own, with the width
NVML gives: a field value's ``valueType`` (the PCIe byte counters come back as 32-bit
``uiVal``: the committed H100 bundle recorded one wrapping), 64 bits for
``nvmlDeviceGetTotalEnergyConsumption`` and the violation times (``c_ulonglong`` in pynvml).
Energy and violation times stay absolute (the driver's count), the byte counters count from the
first reading. :meth:`NvmlSource.fields` called at the end of a run names every wrap and reset.

Update periods are recorded only where known. Utilisation is averaged over a driver sample
period "between 1 second and 1/6 second depending on the product" (NVML docs), so it is left
unknown, as are temperatures, clocks and the other counters.
"""

import ctypes
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from kit.telemetry.base import (
    FieldInfo,
    TelemetryError,
    TelemetryNotSupportedError,
    TelemetrySource,
    by_device,
    vendor_error,
    vendor_errors,
)
from kit.telemetry.counters import WrappingCounter, describe_events, modulus_of_bits
from kit.telemetry.fields import make_row
from kit.telemetry.nvidia.throttle import decode_nvml_clocks_event_reasons

logger = logging.getLogger(__name__)

HOPPER_POWER_PERIOD_MS = 100.0
"""How often NVML refreshes power and the energy counter on Hopper (H100, H200): about every
100 ms (Yang et al., "Part-time Power Measurements: nvidia-smi's Lack of Attention", 2024).
``benchmarks/telemetry/nvml_probe.py`` measures it on the machine at hand."""

SLOW_FIELDS = frozenset({"energy_j", "pcie_tx_bytes", "pcie_rx_bytes", "link_tx_bytes",
                         "link_rx_bytes", "viol_power_s", "viol_thermal_s"})
"""Cumulative counters whose NVML queries are slow; read every :data:`SLOW_READ_MS`."""

SLOW_READ_MS = 100.0
"""Read period of :data:`SLOW_FIELDS`: the energy counter's own refresh period on Hopper, so
reading it more often repeats values; the byte counters and violation times are cumulative,
so a coarser read loses nothing but time resolution."""

_POWER_SCOPE_GPU = 0
"""Field-value scope id NVML_POWER_SCOPE_GPU: the GPU's own power. Grace Hopper would need
NVML_POWER_SCOPE_MODULE (GPU + CPU + memory) for its module; the kit targets x86 boards."""

_ERROR_HINTS: dict[str, tuple[type[TelemetryError], str | None]] = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": (
        TelemetryNotSupportedError,
        "libnvidia-ml.so not found: install the NVIDIA driver, or in a container run with the "
        "NVIDIA container toolkit (docker --gpus all)",
    ),
    "NVML_ERROR_DRIVER_NOT_LOADED": (
        TelemetryNotSupportedError,
        "the NVIDIA kernel driver is not loaded: check nvidia-smi and `lsmod | grep nvidia`",
    ),
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": (
        TelemetryNotSupportedError,
        "NVML and the kernel driver differ in version (driver upgraded without a reboot): "
        "reboot or reload the nvidia kernel modules",
    ),
    "NVML_ERROR_NO_PERMISSION": (
        TelemetryNotSupportedError,
        "permission denied: the user needs read access to /dev/nvidia*",
    ),
    "NVML_ERROR_FUNCTION_NOT_FOUND": (
        TelemetryNotSupportedError,
        "the driver is older than this nvidia-ml-py: upgrade the driver",
    ),
    "NVML_ERROR_NOT_SUPPORTED": (TelemetryNotSupportedError, None),
    "NVML_ERROR_GPU_IS_LOST": (
        TelemetryError,
        "the GPU fell off the bus: see `dmesg` for Xid errors",
    ),
}
"""NVML error constant name -> kit exception class and how to fix it; other codes become a
plain :class:`TelemetryError`. Names, not values, because pynvml is imported lazily."""

_VALUE_ATTRS: dict[str, tuple[str, int | None]] = {
    "NVML_VALUE_TYPE_DOUBLE": ("dVal", None),
    "NVML_VALUE_TYPE_UNSIGNED_INT": ("uiVal", 8 * ctypes.sizeof(ctypes.c_uint)),
    "NVML_VALUE_TYPE_UNSIGNED_LONG": ("ulVal", 8 * ctypes.sizeof(ctypes.c_ulong)),
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": ("ullVal", 8 * ctypes.sizeof(ctypes.c_ulonglong)),
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG": ("sllVal", None),
    "NVML_VALUE_TYPE_SIGNED_INT": ("siVal", None),
    "NVML_VALUE_TYPE_UNSIGNED_SHORT": ("usVal", 8 * ctypes.sizeof(ctypes.c_ushort)),
}
"""Field value type constant name -> the ``c_nvmlValue_t`` union member that holds it, and the
width in bits at which a counter of that type wraps (``None``: signed or floating, not a
wrapping register)."""

_COUNTER_CALL_BITS = 8 * ctypes.sizeof(ctypes.c_ulonglong)
"""Width of the counters NVML returns by call: energy (``c_uint64`` mJ) and violation time
(``c_nvmlViolationTime_t.violationTime``, ``c_ulonglong`` ns). Too wide to wrap within a run, so
a drop in one is a reset (a GPU reset or driver reload)."""


def _convert(nvml: ModuleType, e: Exception, what: str) -> TelemetryError:
    """Turn a ``pynvml.NVMLError`` into the kit's exception, saying what failed and the fix."""
    code = getattr(e, "value", None)
    return vendor_error(what, str(e), lambda name: getattr(nvml, name, None) == code,
                        _ERROR_HINTS)


def _nvml_errors(nvml: ModuleType, what: str) -> AbstractContextManager[None]:
    """Re-raise any ``pynvml.NVMLError`` inside the block as a :class:`TelemetryError`."""
    return vendor_errors(nvml.NVMLError, lambda e: _convert(nvml, e, what))


@dataclass(frozen=True)
class _Batched:
    """A field read from the device's one field-values call: the sum of some entries.

    Attributes:
        label: The NVML field constant, for reasons and notes.
        ids: ``(field id, scope id)`` entries, summed (several for per-link NVLink counters).
        scale: Factor from NVML's unit to the canonical one (e.g. 1e-3 for mW -> W).
        since_start: A cumulative counter (one per entry), reported from its first reading.
    """

    label: str
    ids: tuple[tuple[int, int], ...]
    scale: float
    since_start: bool = False


@dataclass(frozen=True)
class _Call:
    """A field read by its own NVML call.

    Attributes:
        label: The NVML function, for reasons and notes.
        read: Returns the field in canonical units, or a cumulative counter's raw value.
        counter_scale: For a cumulative counter: factor from its raw unit to the canonical
            one; the raw value is unwrapped (64 bits) and the field stays absolute.
    """

    label: str
    read: Callable[[], float | int]
    counter_scale: float | None = None


_Candidate = _Batched | _Call | str
"""One way to read a field, tried in order; a ``str`` is a way known not to exist, and why."""


@dataclass(frozen=True)
class _Slot:
    """Where a chosen :class:`_Batched` field sits in a device's field-values request.

    Attributes:
        counters: For a cumulative counter, one :class:`WrappingCounter` per entry; empty for
            an instant value.
    """

    label: str
    start: int
    stop: int
    scale: float
    counters: tuple[WrappingCounter, ...] = ()


@dataclass
class _Reads:
    """How a group of fields is read: one field-values request, plus one call per field."""

    request: list[tuple[int, int]] = field(default_factory=list)
    slots: dict[str, _Slot] = field(default_factory=dict)
    calls: dict[str, _Call] = field(default_factory=dict)
    call_counters: dict[str, tuple[float, WrappingCounter]] = field(default_factory=dict)
    """Cumulative call fields: their first raw reading and their counter."""


@dataclass
class _Device:
    """One GPU: its handle, how each readable field is read, and what each field is."""

    index: int
    handle: Any
    fast: _Reads = field(default_factory=_Reads)
    """Fields read every tick."""
    slow: _Reads = field(default_factory=_Reads)
    """:data:`SLOW_FIELDS`, read every :data:`SLOW_READ_MS`."""
    slow_read_t: float = float("-inf")
    info: dict[str, FieldInfo] = field(default_factory=dict)


def _field_value(nvml: ModuleType, name: str, scale: float, *scopes: int) -> _Candidate:
    """A field-value candidate, or why this pynvml cannot have it."""
    if not hasattr(nvml, name):
        return f"{name} is not in this nvidia-ml-py (upgrade it)"
    return _Batched(name, tuple((getattr(nvml, name), s) for s in scopes or (0,)), scale)


def _counter(nvml: ModuleType, name: str, scale: float, *scopes: int) -> _Candidate:
    """Like :func:`_field_value`, for a cumulative counter reported since the first read."""
    c = _field_value(nvml, name, scale, *scopes)
    return c if isinstance(c, str) else replace(c, since_start=True)


def _active_nvlinks(nvml: ModuleType, handle: Any) -> tuple[list[int], str]:
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


def _candidates(
    nvml: ModuleType, handle: Any, arch: int, nvlink: bool
) -> dict[str, list[_Candidate]]:
    """Every canonical GPU field and the ways to read it on this device, best first."""
    nv, h = nvml, handle
    # NVML documents nvmlDeviceGetPowerUsage as instantaneous on GA100 and older GPUs and as
    # a 1-s average on later ones, so it can stand in for whichever field it matches. Ampere
    # is ambiguous (GA100 vs the rest), an unknown architecture more so: no stand-in there.
    usage = _Call("nvmlDeviceGetPowerUsage", lambda: nv.nvmlDeviceGetPowerUsage(h) * 1e-3)
    gpu = _POWER_SCOPE_GPU
    instant: list[_Candidate] = [_field_value(nv, "NVML_FI_DEV_POWER_INSTANT", 1e-3, gpu)]
    average: list[_Candidate] = [_field_value(nv, "NVML_FI_DEV_POWER_AVERAGE", 1e-3, gpu)]
    if arch < nv.NVML_DEVICE_ARCH_AMPERE:
        instant.append(usage)
    elif nv.NVML_DEVICE_ARCH_AMPERE < arch < nv.NVML_DEVICE_ARCH_UNKNOWN:
        average.append(usage)
    links, no_link_why = (
        _active_nvlinks(nv, h) if nvlink else ([], "NVLink counters not requested (nvlink=False)")
    )

    def violation_s(policy: int) -> _Call:
        # violationTime: cumulative nanoseconds the policy held the clocks below target.
        return _Call(
            "nvmlDeviceGetViolationStatus",
            lambda: nv.nvmlDeviceGetViolationStatus(h, policy).violationTime,
            counter_scale=1e-9,
        )

    def throttle_bits(name: str) -> _Call:
        reasons = getattr(nv, name)
        return _Call(name, lambda: decode_nvml_clocks_event_reasons(reasons(h)))

    def nvlink_bytes(name: str) -> list[_Candidate]:
        # One KiB counter per link (scope id = link), summed over the links that are up.
        return [_counter(nv, name, 1024, *links) if links else no_link_why]

    return {
        "power_w": instant,
        "power_avg_w": average,
        "energy_j": [
            _Call(
                "nvmlDeviceGetTotalEnergyConsumption",  # mJ since the driver was loaded
                lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
                counter_scale=1e-3,
            )
        ],
        "temp_gpu_c": [
            _Call(
                "nvmlDeviceGetTemperature",
                lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            )
        ],
        "temp_mem_c": [_field_value(nv, "NVML_FI_DEV_MEMORY_TEMP", 1.0)],
        "clock_sm_mhz": [
            _Call(
                "nvmlDeviceGetClockInfo",
                lambda: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            )
        ],
        "clock_mem_mhz": [
            _Call(
                "nvmlDeviceGetClockInfo",
                lambda: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            )
        ],
        "util_gpu_pct": [
            _Call(
                "nvmlDeviceGetUtilizationRates",
                lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu),
            )
        ],
        "mem_used_bytes": [
            _Call("nvmlDeviceGetMemoryInfo", lambda: int(nv.nvmlDeviceGetMemoryInfo(h).used))
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
        "pcie_tx_bytes": [_counter(nv, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 1)],
        "pcie_rx_bytes": [_counter(nv, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 1)],
        "link_tx_bytes": nvlink_bytes("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"),
        "link_rx_bytes": nvlink_bytes("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"),
    }


def _group_reasons(devices: list[_Device], name: str) -> str:
    """One reason per distinct cause of a field's gap, naming the devices it applies to."""
    return by_device((d.index, str(d.info[name].reason)) for d in devices
                     if not d.info[name].readable)


class NvmlSource(TelemetrySource):
    """One ``gpu`` row per NVIDIA device per tick, read through NVML.

    Args:
        node: Node index written into every row.
        devices: NVML device indices to sample (see the module docstring on index order);
            ``None`` samples every GPU of the node. Rows carry these indices as ``device``.

    Raises:
        TelemetryNotSupportedError: nvidia-ml-py is missing, NVML does not start (no driver,
            version mismatch, permissions; the message says how to fix it), the node has no
            GPU, or ``devices`` names one that does not exist.
        TelemetryError: NVML failed otherwise while opening a device.
    """

    name = "nvml"
    reads_devices = True

    @classmethod
    def probe(cls) -> tuple[str, ...]:
        """The NVIDIA GPUs NVML lists (empty without nvidia-ml-py or a driver)."""
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                return tuple(
                    str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                    for i in range(pynvml.nvmlDeviceGetCount())
                )
            finally:
                pynvml.nvmlShutdown()
        except Exception as e:  # noqa: BLE001 - NVML missing or no NVIDIA driver: no GPUs here.
            logger.debug("NVML not usable: %s", e)
            return ()

    def __init__(self, node: int, devices: list[int] | None = None, nvlink: bool = True) -> None:
        try:
            import pynvml
        except ImportError as e:
            raise TelemetryNotSupportedError(
                f"NVML bindings not importable ({e}): pip install nvidia-ml-py"
            ) from None
        self._nvml: ModuleType = pynvml
        self._node = node
        self._nvlink = nvlink
        self._value_attrs = {
            getattr(pynvml, type_name): attr_bits
            for type_name, attr_bits in _VALUE_ATTRS.items()
            if hasattr(pynvml, type_name)
        }
        with _nvml_errors(pynvml, "NVML did not start (nvmlInit)"):
            pynvml.nvmlInit()
        try:
            self._devices = [self._open(i) for i in self._indices(devices)]
            self._facts = [self._static_facts(d) for d in self._devices]
        except BaseException:
            with suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
            raise
        self._closed = False

    def _indices(self, devices: list[int] | None) -> list[int]:
        """Check the requested NVML indices against the node's device count."""
        with _nvml_errors(self._nvml, "nvmlDeviceGetCount"):
            count = self._nvml.nvmlDeviceGetCount()
        wanted = list(range(count)) if devices is None else list(devices)
        if not wanted or any(not 0 <= i < count for i in wanted):
            raise TelemetryNotSupportedError(
                f"NVML sees {count} GPU(s) on this node; cannot sample devices {wanted}"
            )
        return wanted

    def _open(self, index: int) -> _Device:
        """Get the device's handle and find, once, how each field is read on it."""
        nv = self._nvml
        with _nvml_errors(nv, f"device {index}"):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        try:
            arch = nv.nvmlDeviceGetArchitecture(handle)
        except nv.NVMLError:
            arch = nv.NVML_DEVICE_ARCH_UNKNOWN
        dev = _Device(index, handle)
        candidates = _candidates(nv, handle, arch, self._nvlink)
        ids = sorted({i for cs in candidates.values() for c in cs if isinstance(c, _Batched)
                      for i in c.ids})
        # One call probes every field-value entry; each answer carries its own return code.
        try:
            answers = nv.nvmlDeviceGetFieldValues(handle, ids) if ids else []
            probe = dict(zip(ids, answers, strict=True))
            batch_error = None
        except nv.NVMLError as e:
            probe, batch_error = {}, f"nvmlDeviceGetFieldValues: {e}"
        for name, cands in candidates.items():
            failed: list[str] = []
            for c in cands:
                why = self._adopt(dev, name, c, probe, batch_error)
                if why is None:
                    notes = [*failed, f"read from {c.label}"] if failed else []
                    read_ms = SLOW_READ_MS if name in SLOW_FIELDS else None
                    if read_ms:
                        notes.append(f"read every {read_ms:g} ms (a slow NVML query); "
                                     "null in the rows between")
                    note = "; ".join(notes) or None
                    dev.info[name] = FieldInfo(True, note, self._period_ms(name, arch), read_ms)
                    break
                failed.append(why)
            else:
                dev.info[name] = FieldInfo(False, "; ".join(failed) or "no NVML call for it")
        return dev

    def _adopt(
        self, dev: _Device, name: str, c: _Candidate, probe: dict[tuple[int, int], Any],
        batch_error: str | None,
    ) -> str | None:
        """Use candidate ``c`` for field ``name`` if it reads on ``dev``; else say why not."""
        nv = self._nvml
        reads = dev.slow if name in SLOW_FIELDS else dev.fast
        if isinstance(c, str):
            return c
        t = time.time()
        if isinstance(c, _Call):
            try:
                first = c.read()
            except nv.NVMLError as e:
                return f"{c.label}: {e}"
            reads.calls[name] = c
            if c.counter_scale is not None:
                counter = WrappingCounter(modulus_of_bits(_COUNTER_CALL_BITS))
                counter.update(first, t)
                reads.call_counters[name] = (first, counter)
            return None
        if batch_error:
            return batch_error
        entries = [probe[i] for i in c.ids]
        bad = next((v.nvmlReturn for v in entries if v.nvmlReturn != nv.NVML_SUCCESS), None)
        if bad is not None:
            return f"{c.label}: {nv.NVMLError(bad)}"
        counters: tuple[WrappingCounter, ...] = ()
        if c.since_start:  # the first reading is each counter's zero
            counters = tuple(WrappingCounter(self._modulus(v)) for v in entries)
            for counter, v in zip(counters, entries, strict=True):
                counter.update(self._value(v), t)
        start = len(reads.request)
        reads.request.extend(c.ids)
        reads.slots[name] = _Slot(c.label, start, len(reads.request), c.scale, counters)
        return None

    def _period_ms(self, name: str, arch: int) -> float | None:
        """The counter's refresh period where documented or published, else ``None``."""
        if arch == self._nvml.NVML_DEVICE_ARCH_HOPPER and name in ("power_w", "energy_j"):
            return HOPPER_POWER_PERIOD_MS
        return None

    def _value(self, v: Any) -> float | int:
        """The number in a ``c_nvmlFieldValue_t``, read through the union member its type names."""
        attr_bits = self._value_attrs.get(v.valueType)
        if attr_bits is None:
            raise TelemetryError(f"NVML field {v.fieldId}: unknown value type {v.valueType}")
        return getattr(v.value, attr_bits[0])

    def _modulus(self, v: Any) -> int | None:
        """Where a counter held in ``c_nvmlFieldValue_t`` ``v`` wraps, from its value type."""
        attr_bits = self._value_attrs.get(v.valueType)
        bits = attr_bits[1] if attr_bits else None
        return None if bits is None else modulus_of_bits(bits)

    def _static_facts(self, dev: _Device) -> dict[str, Any]:
        """Read the facts :meth:`devices` reports; one NVML cannot read is left out."""
        nv, h = self._nvml, dev.handle
        reads: dict[str, Callable[[], Any]] = {
            "name": lambda: nv.nvmlDeviceGetName(h),
            "uuid": lambda: nv.nvmlDeviceGetUUID(h),
            "power_limit_w": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) * 1e-3,  # mW
            "clock_sm_max_mhz": lambda: float(nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
            "memory_total_bytes": lambda: int(nv.nvmlDeviceGetMemoryInfo(h).total),
        }
        facts: dict[str, Any] = {"device": dev.index}
        for key, read in reads.items():
            try:
                facts[key] = read()
            except nv.NVMLError as e:
                logger.info("NVML device %d: %s unreadable: %s", dev.index, key, e)
        return facts

    def fields(self) -> dict[str, FieldInfo]:
        """Return each GPU field's readability, over all sampled devices.

        A field is readable when at least one device reads it (the others write ``None``);
        ``reason`` then names the devices that cannot, or, when every device reads it through
        a stand-in (e.g. ``nvmlDeviceGetPowerUsage`` for ``power_avg_w``), says which. Called
        again at the end of a run, it also names every wrap and reset of a cumulative counter.
        """
        out: dict[str, FieldInfo] = {}
        for name in self._devices[0].info:
            infos = [d.info[name] for d in self._devices]
            readable = [i for i in infos if i.readable]
            if not readable:
                info = FieldInfo(False, _group_reasons(self._devices, name))
            elif len(readable) < len(infos):
                first = readable[0]
                info = FieldInfo(True, _group_reasons(self._devices, name),
                                 first.update_period_ms, first.read_period_ms)
            else:
                info = readable[0]
            events = [e for d in self._devices if (e := self._counter_events(d, name))]
            if events:
                info = replace(info, reason="; ".join(filter(None, [info.reason, *events])))
            out[name] = info
        return out

    def _counter_events(self, dev: _Device, name: str) -> str | None:
        """The wraps and resets of field ``name``'s counters on ``dev``, if any."""
        for reads in (dev.fast, dev.slow):
            if name in reads.slots:
                return describe_events(list(reads.slots[name].counters),
                                       f"device {dev.index} {name}")
            if name in reads.call_counters:
                return describe_events([reads.call_counters[name][1]],
                                       f"device {dev.index} {name}")
        return None

    def devices(self) -> list[dict[str, Any]]:
        """Name, UUID, enforced power limit, max SM clock and memory size of each device."""
        return list(self._facts)

    def _read(self, dev: _Device, reads: _Reads, t: float) -> dict[str, Any]:
        """Read one group of fields of one device, in canonical units.

        The fast group's field values come in one request; the slow group's in one request per
        field, which keeps every request small (the 2 x H200 crash came with one 41-entry
        request per device). A cumulative counter that went backwards (a reset, not a wrap)
        reads ``None`` for that sample.
        """
        nv = self._nvml
        values: dict[str, Any] = {}
        if reads is dev.fast:
            requests = [(reads.request, list(reads.slots.items()))] if reads.request else []
        else:
            requests = [(reads.request[s.start:s.stop], [(name, replace(s, start=0,
                                                                       stop=s.stop - s.start))])
                        for name, s in reads.slots.items()]
        for request, slots in requests:
            got = nv.nvmlDeviceGetFieldValues(dev.handle, request)
            for name, s in slots:
                entries = got[s.start:s.stop]
                for v in entries:
                    if v.nvmlReturn != nv.NVML_SUCCESS:
                        what = f"device {dev.index} {s.label}"
                        raise _convert(nv, nv.NVMLError(v.nvmlReturn), what)
                if s.counters:
                    counted = [c.update(self._value(v), t)
                               for c, v in zip(s.counters, entries, strict=True)]
                    values[name] = None if None in counted else int(
                        sum(c.advance for c in s.counters) * s.scale)
                else:
                    values[name] = sum(self._value(v) for v in entries) * s.scale
        for name, call in reads.calls.items():
            raw = call.read()
            if name in reads.call_counters:
                first, counter = reads.call_counters[name]
                advance = counter.update(raw, t)
                raw = None if advance is None else first + advance
            values[name] = raw if raw is None or call.counter_scale is None else (
                raw * call.counter_scale)
        return values

    def sample(self, t: float) -> list[dict[str, Any]]:
        """Read every device once; see :meth:`TelemetrySource.sample`.

        Raises:
            TelemetryError: An NVML read that worked at construction failed (e.g. the GPU
                was lost); the message names the device.
        """
        rows = []
        for dev in self._devices:
            with _nvml_errors(self._nvml, f"device {dev.index}"):
                values = self._read(dev, dev.fast, t)
                if (t - dev.slow_read_t) * 1e3 >= SLOW_READ_MS:
                    values.update(self._read(dev, dev.slow, t))
                    dev.slow_read_t = t
            rows.append(make_row(t, self._node, dev.index, "gpu", **values))
        return rows

    def close(self) -> None:
        """Shut NVML down; never raises, since the sampler calls it on a failed source too."""
        if self._closed:
            return
        self._closed = True
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as e:
            logger.warning("nvmlShutdown failed: %s", e)
