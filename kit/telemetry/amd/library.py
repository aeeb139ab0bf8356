"""Loading AMD SMI's Python package and converting its errors: not yet verified on hardware.

The amdsmi package prints to stdout and raises a ``KeyError`` when libamd_smi.so is missing;
:func:`load_amdsmi` imports it silently and says, in one line, what is missing and how to fix
it. Its exceptions become :class:`~kit.telemetry.base.TelemetryError` at the boundary
(:func:`amdsmi_errors`), each with how to fix it where the status says.
"""

import importlib
import io
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, redirect_stdout
from types import ModuleType

from kit.telemetry.base import (
    ErrorHints,
    TelemetryError,
    TelemetryNotSupportedError,
    vendor_error,
    vendor_errors,
)

logger = logging.getLogger(__name__)

NOT_VERIFIED = "not yet verified on hardware"
"""Appended to every reason this backend reports, until an AMD GPU run has checked it."""

MIN_VERSION = "6.1"
"""The oldest AMD SMI (ROCm) release whose Python API this backend was checked against."""

REQUIRED_API = (
    "amdsmi_init", "amdsmi_shut_down", "amdsmi_get_processor_handles",
    "amdsmi_get_gpu_asic_info", "amdsmi_get_power_info", "amdsmi_get_energy_count",
    "amdsmi_get_temp_metric", "amdsmi_get_clock_info", "amdsmi_get_gpu_activity",
    "amdsmi_get_gpu_memory_usage", "amdsmi_get_gpu_metrics_info", "AmdSmiException",
    "AmdSmiLibraryException", "AmdSmiInitFlags", "AmdSmiTemperatureType",
    "AmdSmiTemperatureMetric", "AmdSmiClkType", "AmdSmiMemoryType",
)
"""What every AMD SMI from 6.1 on has, and this backend cannot do without."""

TRANSIENT_STATUSES = ("AMDSMI_STATUS_RETRY", "AMDSMI_STATUS_BUSY", "AMDSMI_STATUS_TIMEOUT")
"""Statuses after which a read is retried on the next tick (AMD SMI's docs:
``AmdSmiRetryException`` "signals device is busy and call should be retried")."""

_LIBRARY_MISSING = (
    "AMD SMI library not found (libamd_smi.so): install ROCm's amd-smi-lib and the amdsmi "
    "Python package of the same ROCm release, or set ROCM_PATH to the ROCm install"
)


@contextmanager
def _stdout_captured(sink: io.StringIO) -> Iterator[None]:
    """Send what runs inside to ``sink`` (Python prints) and to /dev/null (writes to fd 1).

    Not yet verified on hardware.

    The amdsmi package ``print()``s two lines to stdout when it cannot load libamd_smi.so
    (then raises ``KeyError: 'libamd_smi.so'``); the C library could write to fd 1 as well.
    Neither may reach the sampler's or the CLI's stdout.
    """
    sys.stdout.flush()
    saved_fd = os.dup(1)
    null_fd = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null_fd, 1)
        with redirect_stdout(sink):
            yield
    finally:
        os.dup2(saved_fd, 1)
        os.close(saved_fd)
        os.close(null_fd)


def load_amdsmi() -> ModuleType:
    """Import the ``amdsmi`` package, or say why it cannot be used here.

    Not yet verified on hardware. The import prints nothing. A failed import is tried again on
    the next call (Python keeps a module only once it imported), which happens once per source.

    Raises:
        TelemetryNotSupportedError: amdsmi or libamd_smi.so is missing or they do not match
            (the message starts "AMD SMI library not found (libamd_smi.so)" and says the fix),
            or the package is older than :data:`MIN_VERSION` (the message names it).
    """
    printed = io.StringIO()
    try:
        with _stdout_captured(printed):
            module = importlib.import_module("amdsmi")
    # ImportError: no amdsmi package. OSError or KeyError 'libamd_smi.so': the package is
    # there but libamd_smi.so is not (it prints why, then fails on its first symbol).
    # AttributeError: libamd_smi.so lacks a symbol, i.e. is older than the package.
    except (ImportError, OSError, KeyError, AttributeError) as e:
        said = " ".join(printed.getvalue().split())
        why = f"{type(e).__name__}: {e}" + (f"; amdsmi printed: {said}" if said else "")
        logger.info("amdsmi not importable: %s", why)
        raise TelemetryNotSupportedError(f"{_LIBRARY_MISSING} ({why})") from None
    missing = [name for name in REQUIRED_API if not hasattr(module, name)]
    if missing:
        raise TelemetryNotSupportedError(
            f"amdsmi {amdsmi_version(module)} lacks {', '.join(missing)}: the amdsmi backend "
            f"needs AMD SMI {MIN_VERSION} (ROCm {MIN_VERSION}) or newer"
        )
    return module


def amdsmi_version(smi: ModuleType) -> str:
    """The amdsmi package's release (``amdsmi.__version__``, e.g. "6.3.3").

    Not yet verified on hardware. "(unknown version)" when the package has none (ROCm 5.x).
    """
    return str(getattr(smi, "__version__", "(unknown version)"))


_ERROR_HINTS: ErrorHints = {
    "AMDSMI_STATUS_NOT_SUPPORTED": (TelemetryNotSupportedError, None),
    "AMDSMI_STATUS_NO_PERM": (
        TelemetryNotSupportedError,
        "permission denied: the user needs access to /dev/kfd and /dev/dri/renderD* "
        "(groups video and render)",
    ),
    "AMDSMI_STATUS_DRIVER_NOT_LOADED": (
        TelemetryNotSupportedError,
        "the amdgpu kernel driver is not loaded: check `lsmod | grep amdgpu` and dmesg",
    ),
    "AMDSMI_STATUS_INIT_ERROR": (
        TelemetryNotSupportedError,
        "AMD SMI could not initialise: check that amdgpu is loaded and /dev/kfd exists",
    ),
    "AMDSMI_STATUS_NOT_FOUND": (TelemetryNotSupportedError, None),
}
"""AMD SMI status name -> kit exception class and how to fix it; other codes become a plain
:class:`TelemetryError`. Names, not values, because amdsmi is imported lazily."""


def describe(e: Exception) -> str:
    """One line for an AMD SMI exception (its ``str`` spans lines).

    Not yet verified on hardware.
    """
    return " ".join(str(e).split())


def status_is(smi: ModuleType, e: Exception, names: Sequence[str]) -> bool:
    """Whether AMD SMI exception ``e`` carries one of the named statuses.

    Not yet verified on hardware.
    """
    code = getattr(e, "err_code", None)
    return code is not None and any(
        getattr(smi.amdsmi_wrapper, name, None) == code for name in names
    )


def _convert(smi: ModuleType, e: Exception, what: str) -> TelemetryError:
    """Turn an ``amdsmi.AmdSmiException`` into the kit's exception, saying what failed.

    Not yet verified on hardware.
    """
    return vendor_error(what, describe(e), lambda name: status_is(smi, e, [name]),
                        _ERROR_HINTS)


def amdsmi_errors(smi: ModuleType, what: str) -> AbstractContextManager[None]:
    """Re-raise any ``amdsmi.AmdSmiException`` inside the block as a :class:`TelemetryError`.

    Not yet verified on hardware.
    """
    return vendor_errors(smi.AmdSmiException, lambda e: _convert(smi, e, what))

