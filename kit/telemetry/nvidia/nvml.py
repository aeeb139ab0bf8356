"""NVIDIA GPU telemetry through NVML (the ``pynvml`` module of nvidia-ml-py).

Per device and tick (:meth:`NvmlSource.sample`), one ``nvmlDeviceGetFieldValues`` request
reads the fast field-value counters (instantaneous and 1-s average power, memory temperature)
and one call each reads GPU temperature, clocks, utilisation, memory and throttle reasons:
about 0.6 ms per device on H200. The slow queries (the energy counter, PCIe and per-link NVLink
byte counters, violation times: 1-13 ms per device each on H200,
:data:`~kit.telemetry.nvidia.candidates.SLOW_READ_MS`) are one :class:`SlowReader` per device
(:meth:`NvmlSource.slow_readers`), which the sampler reads on a thread of its own, each field
at its own period, in rows of their own. Read inside the tick, device after device, they
stretched a 20 ms period to 114 ms on 4 x H200 (issue 25). How each field is read is in
:mod:`kit.telemetry.nvidia.candidates` and :mod:`kit.telemetry.nvidia.device`.

Device indices are NVML's: every GPU of the node in NVML's (nvidia-smi's) order, regardless
of ``CUDA_VISIBLE_DEVICES``. CUDA's default order (fastest first) can differ from it, so match
ranks to devices by the UUIDs in :meth:`NvmlSource.devices`, or run with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``.

Update periods are recorded only where known. Utilisation is averaged over a driver sample
period "between 1 second and 1/6 second depending on the product" (NVML docs), so it is left
unknown, as are temperatures, clocks and the other counters. :meth:`NvmlSource.fields` called
at the end of a run names every counter wrap and reset, and every slow field lost mid-run.
"""

import logging
from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace
from types import ModuleType
from typing import Any

from kit.bundle.telemetry_fields import make_row
from kit.telemetry.base import (
    FieldInfo,
    SlowReader,
    TelemetryNotSupportedError,
    TelemetrySource,
    by_device,
)
from kit.telemetry.nvidia.candidates import SLOW_READ_MS
from kit.telemetry.nvidia.device import Decoder, NvmlDevice, open_device, read_fast, read_slow
from kit.telemetry.nvidia.errors import nvml_errors

logger = logging.getLogger(__name__)


def _group_reasons(devices: list[NvmlDevice], name: str) -> str:
    """One reason per distinct cause of a field's gap, naming the devices it applies to."""
    return by_device((d.index, str(d.info[name].reason)) for d in devices
                     if not d.info[name].readable)


class NvmlSource(TelemetrySource):
    """One ``gpu`` row per NVIDIA device per tick, read through NVML, and its slow readers.

    Args:
        node: Node index written into every row.
        devices: NVML device indices to sample (see the module docstring on index order);
            ``None`` samples every GPU of the node. Rows carry these indices as ``device``.
        nvlink: Whether to read the NVLink byte counters.

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
        self._decoder = Decoder(pynvml)
        with nvml_errors(pynvml, "NVML did not start (nvmlInit)"):
            pynvml.nvmlInit()
        try:
            self._devices = [open_device(pynvml, self._decoder, i, nvlink)
                             for i in self._indices(devices)]
            self._facts = [self._static_facts(d) for d in self._devices]
        except BaseException:
            with suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
            raise
        self._readers = [r for d in self._devices if (r := self._slow_reader(d))]
        self._closed = False

    def _indices(self, devices: list[int] | None) -> list[int]:
        """Check the requested NVML indices against the node's device count."""
        with nvml_errors(self._nvml, "nvmlDeviceGetCount"):
            count = self._nvml.nvmlDeviceGetCount()
        wanted = list(range(count)) if devices is None else list(devices)
        if not wanted or any(not 0 <= i < count for i in wanted):
            raise TelemetryNotSupportedError(
                f"NVML sees {count} GPU(s) on this node; cannot sample devices {wanted}"
            )
        return wanted

    def _static_facts(self, dev: NvmlDevice) -> dict[str, Any]:
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

    def _slow_reader(self, dev: NvmlDevice) -> SlowReader | None:
        """The device's slow fields as one reader, each at its period; none if it has none."""
        names = dev.slow.names()
        if not names:
            return None

        def read(t: float, fields: frozenset[str]) -> dict[str, Any] | None:
            if all(n in dev.lost for n in names):
                return None
            values = read_slow(self._nvml, self._decoder, dev, t, fields)
            return make_row(t, self._node, dev.index, "gpu", **values)

        return SlowReader(f"device {dev.index}", {n: SLOW_READ_MS[n] for n in names}, read)

    def fields(self) -> dict[str, FieldInfo]:
        """Return each GPU field's readability, over all sampled devices.

        A field is readable when at least one device reads it (the others write ``None``);
        ``reason`` then names the devices that cannot, or, when every device reads it the same
        way, says how (which NVML field or call, and for a slow field its period). Called
        again at the end of a run, it also names every wrap and reset of a cumulative counter
        and every slow field lost mid-run.
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
            events = [e for d in self._devices if (e := d.events(name))]
            if events:
                info = replace(info, reason="; ".join(filter(None, [info.reason, *events])))
            out[name] = info
        return out

    def devices(self) -> list[dict[str, Any]]:
        """Name, UUID, enforced power limit, max SM clock and memory size of each device."""
        return list(self._facts)

    def sample(self, t: float) -> list[dict[str, Any]]:
        """Read every device's fast fields once; see :meth:`TelemetrySource.sample`.

        Raises:
            TelemetryError: An NVML read that worked at construction failed (e.g. the GPU
                was lost); the message names the device.
        """
        return [make_row(t, self._node, dev.index, "gpu",
                         **read_fast(self._nvml, self._decoder, dev, t))
                for dev in self._devices]

    def slow_readers(self) -> list[SlowReader]:
        """One reader per device with slow fields: energy, PCIe and NVLink byte counters,
        violation times, each at its period in
        :data:`~kit.telemetry.nvidia.candidates.SLOW_READ_MS`."""
        return list(self._readers)

    def close(self) -> None:
        """Shut NVML down; never raises, since the sampler calls it on a failed source too."""
        if self._closed:
            return
        self._closed = True
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as e:
            logger.warning("nvmlShutdown failed: %s", e)
