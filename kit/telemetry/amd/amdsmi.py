"""AMD GPU telemetry through AMD SMI (ROCm's ``amdsmi`` package): not yet verified on hardware.

Written against AMD SMI's own sources with no AMD GPU reachable: the Python package of
releases 6.1.2, 6.3.3 and 7.0.2 (``amdsmi_interface.py``, ``amdsmi_exception.py``,
``amdsmi_wrapper.py``), the C library and ``rocm_smi.py`` of ROCm/amdsmi, and the amdgpu kernel
driver's headers; ``docs/telemetry-amd.md`` lists what was checked where. Every reason this
backend gives, in :meth:`AmdSmiSource.fields` and so in every bundle that uses it, says "not yet
verified on hardware".

Per device and tick (:meth:`AmdSmiSource.sample`) it makes each AMD SMI call its fast fields
need once: socket power (``amdsmi_get_power_info``), hotspot and VRAM temperature
(``amdsmi_get_temp_metric``), GFX and memory clocks (``amdsmi_get_clock_info``), GFX activity
(``amdsmi_get_gpu_activity``), VRAM used (``amdsmi_get_gpu_memory_usage``) and throttle reasons
(gpu_metrics). The cumulative counters (the energy accumulator, ``amdsmi_get_energy_count``, and
gpu_metrics' xGMI data counters: :data:`~kit.telemetry.amd.readers.SLOW_READ_MS`) are one
:class:`SlowReader` per device (:meth:`AmdSmiSource.slow_readers`), which the sampler reads on
a thread of its own, each field at its own period, in rows of their own, so a slow call on one
of an MI250 node's 8 GCDs never delays the others' fast rows. It never calls
``amdsmi_get_violation_status``, which sleeps 100 ms per device inside the library.

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

import logging
import os
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from kit.bundle.telemetry_fields import make_row
from kit.telemetry.amd.device import AmdDevice, FieldRead, read_fields
from kit.telemetry.amd.library import (
    NOT_VERIFIED,
    TRANSIENT_STATUSES,
    amdsmi_errors,
    amdsmi_version,
    describe,
    load_amdsmi,
    status_is,
)
from kit.telemetry.amd.quirks import (
    ENERGY_CHECK_MIN_S,
    asic_family,
    gfx_target_from_name,
    is_mi250,
    mi250_dies,
    mi250_is_secondary,
    package_share,
)
from kit.telemetry.amd.readers import SLOW_READ_MS, Reader, Tick, num, readers, scaled
from kit.telemetry.base import (
    FieldInfo,
    SlowReader,
    TelemetryNotSupportedError,
    TelemetrySource,
    by_device,
)

__all__ = ["AmdSmiSource", "load_amdsmi"]

logger = logging.getLogger(__name__)

MAX_PLAUSIBLE_TEMP_C = 200.0
"""A first temperature above this is not in deg C: amdsmi.h says ``amdsmi_get_temp_metric``
returns degrees C, AMD SMI's Python docs say millidegrees; such a sensor is not used."""

_PACKAGE_FIELDS = ("power_w", "power_avg_w", "energy_j")
"""Fields that cover an MI250's whole package (quirk (a))."""


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
        with amdsmi_errors(smi, "AMD SMI did not start (amdsmi_init)"):
            smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
        try:
            with amdsmi_errors(smi, "amdsmi_get_processor_handles"):
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
            self._readers = [r for d in self._devices if (r := self._slow_reader(d))]
        except BaseException:
            with suppress(smi.AmdSmiException):
                smi.amdsmi_shut_down()
            raise
        self._closed = False

    def _open(self, index: int, handle: Any) -> AmdDevice | None:
        """Identify the device and find, once, how each field is read on it.

        Returns ``None`` (and keeps the reason) when even its identity cannot be read.

        Not yet verified on hardware.
        """
        smi = self._smi
        try:
            asic = smi.amdsmi_get_gpu_asic_info(handle)
        except smi.AmdSmiException as e:
            self._unopened[index] = f"amdsmi_get_gpu_asic_info: {describe(e)}"
            return None
        name = str(asic.get("market_name", "N/A"))
        gfx = asic.get("target_graphics_version")
        if isinstance(gfx, str) and gfx.startswith("gfx"):
            gfx_target, gfx_note = gfx, "from amdsmi_get_gpu_asic_info"
        else:
            gfx_target = gfx_target_from_name(name)
            gfx_note = (f"from the market name (amdsmi {self._version} has no "
                        "target_graphics_version)")
        dev = AmdDevice(index, handle, name, gfx_target, gfx_note)
        family = asic_family(gfx_target) if gfx_target else None
        tick = Tick(smi, time.time())
        for column, how in readers(smi, handle, family, gfx_target).items():
            dev.fields[column] = self._adopt(column, how, tick)
        return dev

    def _adopt(self, name: str, how: tuple[str, Reader] | str, tick: Tick) -> FieldRead:
        """Use ``how`` for field ``name`` if it reads on this device; else say why not.

        Not yet verified on hardware.
        """
        if isinstance(how, str):
            return FieldRead(None, how)
        label, read = how
        probe = getattr(read, "probe", read)
        try:
            value = probe(tick)
        except self._smi.AmdSmiException as e:
            if status_is(self._smi, e, TRANSIENT_STATUSES):
                return FieldRead(read, f"read from {label} (its first read answered "
                                    f"{describe(e)}; retried every tick)")
            return FieldRead(None, f"{label}: {describe(e)}")
        except KeyError as e:
            return FieldRead(None, f"{label}: amdsmi {self._version} returns no {e} (checked "
                                f"against AMD SMI 6.1.2, 6.3.3, 7.0.2)")
        if value is None:
            return FieldRead(None, f"{label}: AMD SMI reports N/A on this device")
        if name.startswith("temp_") and value > MAX_PLAUSIBLE_TEMP_C:
            return FieldRead(None, f"{label} read {value}, not a temperature in deg C")
        slow = (f"; read every {SLOW_READ_MS[name]:g} ms off the fast path, in rows of its own"
                if name in SLOW_READ_MS else "")
        return FieldRead(read, f"read from {label}{slow}", probed=value)

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

    def _setup_energy(self, dev: AmdDevice) -> None:
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

    def _static_facts(self, dev: AmdDevice) -> dict[str, Any]:
        """Read the facts :meth:`devices` reports; one AMD SMI cannot read is left out.

        Not yet verified on hardware.
        """
        smi, h = self._smi, dev.handle
        reads: dict[str, Callable[[], Any]] = {
            "uuid": lambda: smi.amdsmi_get_gpu_device_uuid(h),
            # power_cap in microwatts (AMD SMI Python API docs, amdsmi_get_power_cap_info)
            "power_limit_w": lambda: scaled(smi.amdsmi_get_power_cap_info(h)["power_cap"], 1e-6),
            "clock_sm_max_mhz": lambda: num(
                smi.amdsmi_get_clock_info(h, smi.AmdSmiClkType.GFX)["max_clk"]
            ),
            "memory_total_bytes": lambda: scaled(
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
            readable = any(ok for _, ok, _ in verdicts)
            out[name] = FieldInfo(readable, _with_unverified(text),
                                  read_period_ms=SLOW_READ_MS.get(name) if readable else None)
        return out

    def devices(self) -> list[dict[str, Any]]:
        """Name, UUID, power cap, max GFX clock, VRAM size, gfx target and amdsmi release.

        Not yet verified on hardware. On MI250 also the package and die observed, and why.
        """
        return list(self._facts)

    def sample(self, t: float) -> list[dict[str, Any]]:
        """Read every device's fast fields once; see :meth:`TelemetrySource.sample`.

        Not yet verified on hardware. Never raises for a device's failure: a failed field of a
        device is null from then on (or retried, if transient), and a device with no fast field
        left gives no more fast rows; :meth:`fields` says what was lost when.
        """
        rows = []
        for dev in self._devices:
            fast = [n for n in dev.fields if n not in SLOW_READ_MS]
            if dev.live(fast):
                values = read_fields(self._smi, self._version, dev, t, fast)
                rows.append(make_row(t, self._node, dev.index, "gpu", **values))
        return rows

    def _slow_reader(self, dev: AmdDevice) -> SlowReader | None:
        """The device's slow fields as one reader, each at its period; none if it reads none.

        Not yet verified on hardware.
        """
        names = [n for n in SLOW_READ_MS if dev.fields[n].read is not None]
        if not names:
            return None

        def read(t: float, fields: frozenset[str]) -> dict[str, Any] | None:
            if not dev.live(names):
                return None
            values = read_fields(self._smi, self._version, dev, t,
                                 [n for n in names if n in fields])
            return make_row(t, self._node, dev.index, "gpu", **values)

        return SlowReader(f"device {dev.index}", {n: SLOW_READ_MS[n] for n in names}, read)

    def slow_readers(self) -> list[SlowReader]:
        """One reader per device with a slow field: the energy counter and the xGMI data
        counters, each at its period in :data:`~kit.telemetry.amd.readers.SLOW_READ_MS`.

        Not yet verified on hardware.
        """
        return list(self._readers)

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
