"""Find which shipped platform this host is, from what its drivers report."""

from functools import lru_cache

from kit.spec.loader import load_platform, platform_names
from kit.spec.platform import PlatformSpec


@lru_cache(maxsize=1)
def local_accelerator_names() -> tuple[str, ...]:
    """Names of this host's accelerators as their drivers report them (empty on a CPU host):
    the first telemetry backend that finds any (:meth:`TelemetrySource.probe`)."""
    from kit.telemetry import SOURCES, load_source_class

    for target in SOURCES.values():
        names = load_source_class(target).probe()
        if names:
            return names
    return ()


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
