"""This node's accelerators as their drivers list them, and which of them a run's ranks use.

The first telemetry backend that finds any devices names them (:meth:`TelemetrySource.probe`);
platform detection (kit.plan.detect) matches those names, and each device backend samples the
devices the node's ranks run on (:meth:`TelemetrySource.plan`).
"""

from functools import lru_cache

from kit.config import visible_devices
from kit.config.telemetry_sources import SOURCES, load_source_class

SOURCE_VENDORS: dict[str, str] = {"nvml": "nvidia", "amdsmi": "amd"}
"""Telemetry backends that list a vendor's accelerators, for its visible-device variables."""


@lru_cache(maxsize=1)
def node_accelerators() -> tuple[str, tuple[str, ...]]:
    """``(vendor, names)`` of every accelerator of this node as its driver lists them, in
    driver order, whatever the visible-device variables say (``("cpu", ())`` on a CPU host):
    the first telemetry backend that finds any (:meth:`TelemetrySource.probe`)."""
    for name, target in SOURCES.items():
        names = load_source_class(target).probe()
        if names:
            return SOURCE_VENDORS.get(name, name), names
    return "cpu", ()


def local_accelerator_names() -> tuple[str, ...]:
    """Names of the accelerators this process may use: the node's, less those the vendor's
    visible-device variables hide (:mod:`kit.config.visible_devices`)."""
    vendor, names = node_accelerators()
    return visible_devices.select(names, vendor) if names else ()


def run_device_indices(devices_per_node: int | None) -> list[int]:
    """Driver indices of the devices this node's local ranks ``0..devices_per_node-1`` run
    on: the first visible ones (every index up to the count where no driver lists devices,
    e.g. a replayed trace)."""
    used = devices_per_node or 0
    vendor, names = node_accelerators()
    if not names:
        return list(range(used))
    return visible_devices.visible_indices(vendor, len(names))[:used]
