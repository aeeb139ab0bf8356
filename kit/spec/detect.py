"""Find which shipped platform this host is, from what its drivers report."""

import logging
import os
from functools import lru_cache

from kit.spec.loader import load_platform, platform_names
from kit.spec.platform import PlatformSpec

log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def local_accelerator_names() -> tuple[str, ...]:
    """Names of this host's accelerators as their drivers report them (empty on a CPU host)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
            return tuple(
                str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(n)
            )
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # NVML missing or no NVIDIA driver: not an NVIDIA host.
        log.debug("NVML not usable: %s", e)
    if not os.path.exists("/dev/kfd"):  # no AMD GPU driver: skip amdsmi, which prints noise
        return ()
    try:
        import amdsmi

        amdsmi.amdsmi_init()
        try:
            handles = amdsmi.amdsmi_get_processor_handles()
            return tuple(
                str(amdsmi.amdsmi_get_gpu_asic_info(h).get("market_name", "AMD GPU"))
                for h in handles
            )
        finally:
            amdsmi.amdsmi_shut_down()
    except (Exception, KeyError) as e:  # amdsmi raises KeyError 'libamd_smi.so' without ROCm.
        log.debug("AMD SMI not usable: %r", e)
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
