"""Find which shipped platform this host is, from what its drivers report."""

from kit.config.loader import load_platform, platform_names
from kit.config.platform import PlatformSpec
from kit.telemetry.devices import local_accelerator_names


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
