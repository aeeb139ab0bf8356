"""One NVIDIA GPU's reads: which field-values entry or call feeds each field, and reading them.

Which counters a device has is found once, when it is opened (:func:`open_device`): every
candidate of :func:`~kit.telemetry.nvidia.candidates.candidates` is tried, best first, and a
field the device or driver cannot read stays ``None`` in its rows, with NVML's error as the
reason. The fast fields are then read every tick in one field-values request plus one call
each (:func:`read_fast`); the slow ones (:data:`~kit.telemetry.nvidia.candidates.SLOW_READ_MS`)
on their own thread, field by field, each request at most :data:`MAX_SLOW_ENTRIES` entries
(:func:`read_slow`).

Cumulative counters (energy, PCIe and NVLink bytes, violation times) go through
:class:`~kit.telemetry.counters.WrappingCounter`, each NVLink link on its own, with the width
NVML gives: a field value's ``valueType`` (the PCIe byte counters come back as 32-bit
``uiVal``: the committed H100 bundle recorded one wrapping), 64 bits for
``nvmlDeviceGetTotalEnergyConsumption`` and the violation times (``c_ulonglong`` in pynvml).
Energy and violation times stay absolute (the driver's count), the byte counters count from the
first reading.
"""

import ctypes
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from kit.telemetry.base import FieldInfo, TelemetryError
from kit.telemetry.counters import WrappingCounter, describe_events, modulus_of_bits
from kit.telemetry.nvidia.candidates import (
    SLOW_READ_MS,
    Batched,
    Call,
    Candidate,
    candidates,
    update_period_ms,
)
from kit.telemetry.nvidia.errors import convert, nvml_errors

SLOW_CALLS = threading.Lock()
"""Held around each slow NVML call (:func:`read_slow`): the slow lanes of all GPUs make one
call at a time. NVML's slow queries spend their time in the kernel, and concurrent ones on
different GPUs cost far more CPU than the same ones in sequence (4 x H200 under load: an NVLink
request of six links 5.4 ms of CPU alone and 13.3 ms with one thread per GPU, a PCIe counter
0.29 ms and 1.1 ms; benchmarks/telemetry/results/sampler-cost-h200x4.txt), and the sampler used
2.7 cores with a lane per GPU reading at once. The fast reads take no lock, so a busy lane
never delays a tick by more than the one slow call it overlaps."""

_NO_LOCK = nullcontext()
"""The fast reads' lock: none."""

MAX_SLOW_ENTRIES = 6
"""Entries per slow field-values request. The NVLink counters have one entry per link that is
up (18 on H100/H200: 13 ms per device for both directions on H200); requests of a few links
each keep every call short, so where the driver serializes calls to one GPU a fast read waits
for one small request, not for all of them. NVML documents itself thread-safe: the slow reads
of each device run on their own thread beside the fast ones, with no lock of the kit's."""

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


class Decoder:
    """Numbers out of NVML's ``c_nvmlFieldValue_t``, by the value type each is tagged with."""

    def __init__(self, nvml: ModuleType) -> None:
        self._attrs = {getattr(nvml, type_name): attr_bits
                       for type_name, attr_bits in _VALUE_ATTRS.items()
                       if hasattr(nvml, type_name)}

    def value(self, v: Any) -> float | int:
        """The number in ``v``, read through the union member its type names."""
        attr_bits = self._attrs.get(v.valueType)
        if attr_bits is None:
            raise TelemetryError(f"NVML field {v.fieldId}: unknown value type {v.valueType}")
        return getattr(v.value, attr_bits[0])

    def modulus(self, v: Any) -> int | None:
        """Where a counter held in ``v`` wraps, from its value type."""
        attr_bits = self._attrs.get(v.valueType)
        bits = attr_bits[1] if attr_bits else None
        return None if bits is None else modulus_of_bits(bits)


@dataclass(frozen=True)
class Slot:
    """Where a chosen :class:`Batched` field sits in a device's field-values request.

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
class Reads:
    """How a group of fields is read: field-values entries, plus one call per field."""

    request: list[tuple[int, int]] = field(default_factory=list)
    slots: dict[str, Slot] = field(default_factory=dict)
    calls: dict[str, Call] = field(default_factory=dict)
    call_counters: dict[str, tuple[float, WrappingCounter]] = field(default_factory=dict)
    """Cumulative call fields: their first raw reading and their counter."""

    def names(self) -> list[str]:
        """The fields this group reads."""
        return [*self.slots, *self.calls]


@dataclass
class NvmlDevice:
    """One GPU: its handle, how each readable field is read, and what each field is."""

    index: int
    handle: Any
    fast: Reads = field(default_factory=Reads)
    """Fields read every tick."""
    slow: Reads = field(default_factory=Reads)
    """:data:`SLOW_READ_MS` fields, read off the fast path."""
    info: dict[str, FieldInfo] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)
    """Slow fields that failed mid-run and are read no more, and when and why."""

    def events(self, name: str) -> str | None:
        """The wraps and resets of field ``name``'s counters here, and its loss, if any."""
        said = []
        for reads in (self.fast, self.slow):
            if name in reads.slots:
                said.append(describe_events(list(reads.slots[name].counters),
                                            f"device {self.index} {name}"))
            if name in reads.call_counters:
                said.append(describe_events([reads.call_counters[name][1]],
                                            f"device {self.index} {name}"))
        if name in self.lost:
            said.append(f"device {self.index} {name}: {self.lost[name]}")
        return "; ".join(s for s in said if s) or None


def open_device(nvml: ModuleType, decoder: Decoder, index: int, nvlink: bool) -> NvmlDevice:
    """Get device ``index``'s handle and find, once, how each field is read on it."""
    nv = nvml
    with nvml_errors(nv, f"device {index}"):
        handle = nv.nvmlDeviceGetHandleByIndex(index)
    try:
        arch = nv.nvmlDeviceGetArchitecture(handle)
    except nv.NVMLError:
        arch = nv.NVML_DEVICE_ARCH_UNKNOWN
    dev = NvmlDevice(index, handle)
    ways = candidates(nv, handle, arch, nvlink)
    ids = sorted({i for cs in ways.values() for c in cs if isinstance(c, Batched) for i in c.ids})
    # One call probes every field-value entry; each answer carries its own return code.
    try:
        answers = nv.nvmlDeviceGetFieldValues(handle, ids) if ids else []
        probe = dict(zip(ids, answers, strict=True))
        batch_error = None
    except nv.NVMLError as e:
        probe, batch_error = {}, f"nvmlDeviceGetFieldValues: {e}"
    for name, cands in ways.items():
        failed: list[str] = []
        for c in cands:
            why = _adopt(nv, decoder, dev, name, c, probe, batch_error)
            if why is None:
                assert not isinstance(c, str)
                notes = [*failed, f"read from {c.label}" + (f" ({c.note})" if c.note else "")]
                read_ms = SLOW_READ_MS.get(name)
                if read_ms:
                    notes.append(f"read every {read_ms:g} ms off the fast path (a slow NVML "
                                 "query), in rows of its own")
                dev.info[name] = FieldInfo(True, "; ".join(notes),
                                           update_period_ms(nv, name, arch), read_ms)
                break
            failed.append(why)
        else:
            dev.info[name] = FieldInfo(False, "; ".join(failed) or "no NVML call for it")
    return dev


def _adopt(
    nv: ModuleType, decoder: Decoder, dev: NvmlDevice, name: str, c: Candidate,
    probe: dict[tuple[int, int], Any], batch_error: str | None,
) -> str | None:
    """Use candidate ``c`` for field ``name`` if it reads on ``dev``; else say why not."""
    reads = dev.slow if name in SLOW_READ_MS else dev.fast
    if isinstance(c, str):
        return c
    t = time.time()
    if isinstance(c, Call):
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
        counters = tuple(WrappingCounter(decoder.modulus(v)) for v in entries)
        for wrapping, v in zip(counters, entries, strict=True):
            wrapping.update(decoder.value(v), t)
    start = len(reads.request)
    reads.request.extend(c.ids)
    reads.slots[name] = Slot(c.label, start, len(reads.request), c.scale, counters)
    return None


def _field_values(nv: ModuleType, dev: NvmlDevice, request: list[tuple[int, int]],
                  label: str, lock: AbstractContextManager[Any] = _NO_LOCK) -> list[Any]:
    """One field-values request (under ``lock``); an entry's error raises."""
    with lock:
        got = nv.nvmlDeviceGetFieldValues(dev.handle, request)
    for v in got:
        if v.nvmlReturn != nv.NVML_SUCCESS:
            raise convert(nv, nv.NVMLError(v.nvmlReturn), f"device {dev.index} {label}")
    return list(got)


def _slot_value(decoder: Decoder, s: Slot, entries: list[Any], t: float) -> float | int | None:
    """A field from its entries, in canonical units; a counter that reset reads ``None``."""
    if not s.counters:
        return sum(decoder.value(v) for v in entries) * s.scale
    counted = [c.update(decoder.value(v), t) for c, v in zip(s.counters, entries, strict=True)]
    return None if None in counted else int(sum(c.advance for c in s.counters) * s.scale)


def _call_value(reads: Reads, name: str, t: float,
                lock: AbstractContextManager[Any] = _NO_LOCK) -> float | int | None:
    """A call field (read under ``lock``), in canonical units; a counter that reset reads
    ``None``."""
    call = reads.calls[name]
    with lock:
        raw: float | int | None = call.read()
    if name in reads.call_counters:
        first, wrapping = reads.call_counters[name]
        advance = wrapping.update(raw, t)
        raw = None if advance is None else first + advance
    return raw if raw is None or call.counter_scale is None else raw * call.counter_scale


def read_fast(nv: ModuleType, decoder: Decoder, dev: NvmlDevice, t: float) -> dict[str, Any]:
    """Every fast field of ``dev``: one field-values request and one call per other field.

    Raises:
        TelemetryError: An NVML read that worked at construction failed (e.g. the GPU was
            lost); the message names the device.
    """
    reads = dev.fast
    values: dict[str, Any] = {}
    with nvml_errors(nv, f"device {dev.index}"):
        got = _field_values(nv, dev, reads.request, "field values") if reads.request else []
        for name, s in reads.slots.items():
            values[name] = _slot_value(decoder, s, got[s.start:s.stop], t)
        for name in reads.calls:
            values[name] = _call_value(reads, name, t)
    return values


def read_slow(nv: ModuleType, decoder: Decoder, dev: NvmlDevice, t: float,
              names: frozenset[str]) -> dict[str, Any]:
    """The slow fields ``names`` of ``dev``, each on its own: requests of at most
    :data:`MAX_SLOW_ENTRIES` entries, or its call.

    A field whose read fails is read no more on this device (the reason and time go to
    ``dev.lost``, and so to the field's final verdict); the others go on.
    """
    reads = dev.slow
    values: dict[str, Any] = {}
    for name in (n for n in reads.names() if n in names and n not in dev.lost):
        try:
            if name in reads.slots:
                s = reads.slots[name]
                request = reads.request[s.start:s.stop]
                entries = [v for at in range(0, len(request), MAX_SLOW_ENTRIES)
                           for v in _field_values(nv, dev, request[at:at + MAX_SLOW_ENTRIES],
                                                  s.label, SLOW_CALLS)]
                values[name] = _slot_value(decoder, s, entries, t)
            else:
                values[name] = _call_value(reads, name, t, SLOW_CALLS)
        except (nv.NVMLError, TelemetryError) as e:
            dev.lost[name] = f"lost at t={t:.3f}: {e}; read no more"
    return values
