"""NVML's errors, turned into the kit's at the backend's boundary, each with how to fix it."""

from contextlib import AbstractContextManager
from types import ModuleType

from kit.telemetry.base import (
    ErrorHints,
    TelemetryError,
    TelemetryNotSupportedError,
    vendor_error,
    vendor_errors,
)

ERROR_HINTS: ErrorHints = {
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


def convert(nvml: ModuleType, e: Exception, what: str) -> TelemetryError:
    """Turn a ``pynvml.NVMLError`` into the kit's exception, saying what failed and the fix."""
    code = getattr(e, "value", None)
    return vendor_error(what, str(e), lambda name: getattr(nvml, name, None) == code,
                        ERROR_HINTS)


def nvml_errors(nvml: ModuleType, what: str) -> AbstractContextManager[None]:
    """Re-raise any ``pynvml.NVMLError`` inside the block as a :class:`TelemetryError`."""
    return vendor_errors(nvml.NVMLError, lambda e: convert(nvml, e, what))
