"""Find which shipped platform this host is, from what its drivers report."""

from functools import lru_cache

from kit.config import visible_devices
from kit.config.loader import load_platform, platform_names
from kit.config.platform import PlatformSpec

SOURCE_VENDORS: dict[str, str] = {"nvml": "nvidia", "amdsmi": "amd"}
"""Telemetry backends that list a vendor's accelerators, for its visible-device variables."""


@lru_cache(maxsize=1)
def node_accelerators() -> tuple[str, tuple[str, ...]]:
    """``(vendor, names)`` of every accelerator of this node as its driver lists them, in
    driver order, whatever the visible-device variables say (``("cpu", ())`` on a CPU host):
    the first telemetry backend that finds any (:meth:`TelemetrySource.probe`)."""
    from kit.telemetry import SOURCES, load_source_class

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


def detect_platform() -> PlatformSpec:
    """Return the shipped platform whose ``detect_names`` match this host's devices, else cpu."""
    names = local_accelerator_names()
    if names:
        for pname in platform_names():
            spec = load_platform(pname)
            if any(pat in names[0] for pat in spec.detect_names):
                return spec
    return load_platform("cpu")


def platform_present(spec: PlatformSpec) -> bool:
    """Whether ``spec``'s devices are on this host (cpu always is)."""
    if spec.is_cpu:
        return True
    names = local_accelerator_names()
    return bool(names) and any(pat in names[0] for pat in spec.detect_names)
