"""Fake ``amdsmi.amdsmi_wrapper``: the status codes and the one ctypes call the kit makes.

The real module is ctypeslib's binding of libamd_smi.so. Status values are those of its
``amdsmi_status_t`` (identical in the amdsmi 6.1.2, 6.3.3 and 7.0.2 wrappers). The kit calls one
C function through it, ``amdsmi_get_gpu_metrics_info(handle, byref(amdsmi_gpu_metrics_t()))``,
to read MI200's ``throttle_status`` bits; the fake structure has only that member (the real one
has every gpu_metrics field; the kit reads no other from it).
"""

import ctypes

AMDSMI_STATUS_SUCCESS = 0
AMDSMI_STATUS_INVAL = 1
AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_NOT_YET_IMPLEMENTED = 3
AMDSMI_STATUS_FAIL_LOAD_MODULE = 4
AMDSMI_STATUS_FAIL_LOAD_SYMBOL = 5
AMDSMI_STATUS_DRM_ERROR = 6
AMDSMI_STATUS_API_FAILED = 7
AMDSMI_STATUS_TIMEOUT = 8
AMDSMI_STATUS_RETRY = 9
AMDSMI_STATUS_NO_PERM = 10
AMDSMI_STATUS_INTERRUPT = 11
AMDSMI_STATUS_IO = 12
AMDSMI_STATUS_INIT_ERROR = 18
AMDSMI_STATUS_BUSY = 30
AMDSMI_STATUS_NOT_FOUND = 31
AMDSMI_STATUS_NOT_INIT = 32
AMDSMI_STATUS_DRIVER_NOT_LOADED = 34
AMDSMI_STATUS_NO_DATA = 40
AMDSMI_STATUS_UNEXPECTED_DATA = 43

STATUS_INFO = {
    AMDSMI_STATUS_INVAL: "AMDSMI_STATUS_INVAL - Invalid parameters",
    AMDSMI_STATUS_NOT_SUPPORTED: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    AMDSMI_STATUS_DRM_ERROR: "AMDSMI_STATUS_DRM_ERROR - Error when called libdrm",
    AMDSMI_STATUS_API_FAILED: "AMDSMI_STATUS_API_FAILED - API call failed",
    AMDSMI_STATUS_TIMEOUT: "AMDSMI_STATUS_TIMEOUT - Timeout in API call",
    AMDSMI_STATUS_RETRY: "AMDSMI_STATUS_RETRY - Retry operation",
    AMDSMI_STATUS_NO_PERM: "AMDSMI_STATUS_NO_PERM - Permission Denied",
    AMDSMI_STATUS_IO: "AMDSMI_STATUS_IO - I/O Error",
    AMDSMI_STATUS_INIT_ERROR: "AMDSMI_STATUS_INIT_ERROR - Initialization error",
    AMDSMI_STATUS_BUSY: "AMDSMI_STATUS_BUSY - Device busy",
    AMDSMI_STATUS_NOT_FOUND: "AMDSMI_STATUS_NOT_FOUND - Device Not found",
    AMDSMI_STATUS_DRIVER_NOT_LOADED: "AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded",
}
"""``AmdSmiLibraryException.set_err_info``'s texts (amdsmi_exception.py) for these codes."""


class amdsmi_gpu_metrics_t(ctypes.Structure):  # noqa: N801 - the real name
    _fields_ = [("throttle_status", ctypes.c_uint32)]


amdsmi_processor_handle = ctypes.c_void_p


def amdsmi_get_gpu_metrics_info(handle: ctypes.c_void_p, metrics_ref: object) -> int:
    """The C call: fills ``throttle_status`` and returns a status, as libamd_smi does."""
    from . import _c_gpu_metrics  # the package holds the node's state

    return _c_gpu_metrics(handle, metrics_ref)
