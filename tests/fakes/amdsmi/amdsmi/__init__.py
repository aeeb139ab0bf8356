"""Fake ``amdsmi`` (AMD SMI's Python package) for CPU tests: AMD's documented shapes, per release.

Each function returns what ``amdsmi_interface.py`` of the release named by the scenario returns
(PyPI amdsmi 6.1.2, 6.3.3, 7.0.2; the body each one mirrors is cited next to it), including its
"N/A" conversions, from the raw C-level values the scenario gives: 0xFFFF in a power field, all
ones in a gpu_metrics counter. Errors are raised the way ``_check_res`` raises them (RETRY ->
``AmdSmiRetryException``, TIMEOUT -> ``AmdSmiTimeoutException``, any other status ->
``AmdSmiLibraryException``), with the classes of ``amdsmi_exception.py``. Scenario release "5.5"
is ROCm 5.5's package, whose API had other names (``amdsmi_get_device_handles``, ...).

Scenario (``$CHARLLM_FAKE_AMDSMI_SCENARIO``), values as the C library would hand them over::

    {"version": "6.3",                       # "5.5", "6.1", "6.3" or "7.0"
     "init_status": null,                    # or a status name amdsmi_init fails with
     "devices": [{
        "market_name": "AMD Instinct MI300X", "gfx_version": 2370,   # 0x942
        "uuid": "...", "power_cap_uw": 750000000, "max_clk": 2100, "vram_total": 206158430208,
        "current_socket_power": 700, "average_socket_power": 65535,  # W; 0xFFFF is N/A
        "energy_start": 1e12, "energy_w": 700,       # accumulator, counting this many watts
        "energy_reset_after": 40,                    # optional: then it restarts from 0
        "counter_resolution": 15.300000190734863,    # what libamd_smi reports (float32 15.3)
        "temps": {"HOTSPOT": 60, "VRAM": 70}, "clocks": {"GFX": 2100, "MEM": 1300},
        "gfx_activity": 100, "vram_used": 1e10,
        "throttle_status": 4294967295,               # MI200 bits; all ones on MI300
        "residency": {"ppt_residency_acc": 0.5},     # MI300: share of each ms throttled
        "xgmi_kib_per_s": [1e6, 1e6], "xgmi_start": [2**64 - 2, 5],  # null: MI200 (all ones)
        "failures": [{"call": "amdsmi_get_temp_metric", "after": 3, "times": 2,
                      "status": "AMDSMI_STATUS_RETRY"}],   # "times": null = from then on
        "sleep_s": {"amdsmi_get_violation_status": 0.1}}]}

Counters advance with the wall clock from ``amdsmi_init`` (the accumulation counter by one per
ms, as smu_v13_0_6's), so a source sampled in real time sees consistent power and energy.
"""

import ctypes
import json
import os
import time
from enum import IntEnum
from pathlib import Path
from typing import Any

from . import amdsmi_wrapper
from .amdsmi_wrapper import STATUS_INFO

_SCENARIO = json.loads(Path(os.environ["CHARLLM_FAKE_AMDSMI_SCENARIO"]).read_text())
_RELEASE = {"5.5": (5, 5), "6.1": (6, 1), "6.3": (6, 3), "7.0": (7, 0)}[_SCENARIO["version"]]
__version__ = {"6.1": "6.1.2", "6.3": "6.3.3", "7.0": "7.0.2"}.get(_SCENARIO["version"])

U16, U32, U64 = 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF


# --- amdsmi_exception.py ----------------------------------------------------------------------

class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.err_info = STATUS_INFO.get(
            err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred")

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | {self.err_info}"


class AmdSmiRetryException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(amdsmi_wrapper.AMDSMI_STATUS_RETRY)


class AmdSmiTimeoutException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(amdsmi_wrapper.AMDSMI_STATUS_TIMEOUT)


def _check_res(ret_code: int) -> None:
    """amdsmi_interface._check_res."""
    if ret_code == amdsmi_wrapper.AMDSMI_STATUS_RETRY:
        raise AmdSmiRetryException()
    if ret_code == amdsmi_wrapper.AMDSMI_STATUS_TIMEOUT:
        raise AmdSmiTimeoutException()
    if ret_code != amdsmi_wrapper.AMDSMI_STATUS_SUCCESS:
        raise AmdSmiLibraryException(ret_code)


# --- enums of amdsmi_interface.py (names as in every release; values from amdsmi_wrapper 7.0.2) --

class AmdSmiInitFlags(IntEnum):
    INIT_AMD_GPUS = 2


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    VRAM = 2


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0


class AmdSmiClkType(IntEnum):
    GFX = 0
    MEM = 4


class AmdSmiMemoryType(IntEnum):
    VRAM = 0


# --- the node ---------------------------------------------------------------------------------

_t0 = 0.0
_calls: dict[tuple[int, str], int] = {}


def _elapsed() -> float:
    return time.monotonic() - _t0


def _dev(handle: Any) -> tuple[int, dict[str, Any]]:
    index = handle.value - 1
    return index, _SCENARIO["devices"][index]


def _call(handle: Any, name: str) -> dict[str, Any]:
    """Count the call; fail it, or sleep, as the scenario says; return the device."""
    index, dev = _dev(handle)
    n = _calls.get((index, name), 0)
    _calls[(index, name)] = n + 1
    time.sleep(dev.get("sleep_s", {}).get(name, 0.0))
    for f in dev.get("failures", []):
        if f["call"] == name and n >= f["after"] and (f["times"] is None
                                                      or n < f["after"] + f["times"]):
            _check_res(getattr(amdsmi_wrapper, f["status"]))
    return dev


def _energy_count(dev: dict[str, Any], reads: int = 0) -> int:
    """The accumulator: 2^-16 J counts of ``energy_w`` since init (aldebaran / smu_v13_0_6);
    after ``energy_reset_after`` reads it counts from zero again (ROCm/amdsmi#115)."""
    if dev.get("energy_w") is None:
        return 0
    start = dev["energy_start"]
    if reads > dev.get("energy_reset_after", float("inf")):
        start = 0
    return int(start + dev["energy_w"] * _elapsed() / 2**-16)


def _validate(value: Any, max_uint: int, is_bool: bool = False) -> Any:
    """amdsmi_interface._validate_if_max_uint (6.3.3, 7.0.2)."""
    if isinstance(value, list):
        return [("N/A" if v == max_uint else v) for v in value]
    if value == max_uint:
        return "N/A"
    return bool(value) if is_bool else value


def amdsmi_init(flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
    global _t0
    if _SCENARIO.get("init_status"):
        _check_res(getattr(amdsmi_wrapper, _SCENARIO["init_status"]))
    _t0 = time.monotonic()
    _calls.clear()


def amdsmi_shut_down() -> None:
    pass


def amdsmi_get_processor_handles() -> list[ctypes.c_void_p]:
    return [ctypes.c_void_p(i + 1) for i in range(len(_SCENARIO["devices"]))]


def amdsmi_get_gpu_device_uuid(handle: Any) -> str:
    return _call(handle, "amdsmi_get_gpu_device_uuid")["uuid"]


def amdsmi_get_gpu_asic_info(handle: Any) -> dict[str, Any]:
    """6.1.2: no num_compute_units / target_graphics_version; 6.3.3 adds them, as "gfx90a" or
    "gfx942" (each release decodes the C value its own way to that string); 7.0.2 adds
    subsystem_id."""
    dev = _call(handle, "amdsmi_get_gpu_asic_info")
    info = {"market_name": dev["market_name"], "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]", "subvendor_id": "0x1002",
            "device_id": "0x740c", "rev_id": "0x01", "asic_serial": "0x0123456789ABCDEF",
            "oam_id": 0}
    if _RELEASE >= (6, 3):
        info["num_compute_units"] = 304
        info["target_graphics_version"] = "gfx" + format(dev["gfx_version"], "x")
    if _RELEASE >= (7, 0):
        info["subsystem_id"] = "0x0c34"
    return info


def amdsmi_get_power_cap_info(handle: Any) -> dict[str, Any]:
    cap = _call(handle, "amdsmi_get_power_cap_info")["power_cap_uw"]
    return {"power_cap": cap, "default_power_cap": cap, "dpm_cap": 0, "min_power_cap": 0,
            "max_power_cap": cap}


def amdsmi_get_power_info(handle: Any) -> dict[str, Any]:
    """6.1.2 / 6.3.3 / 7.0.2 (7.0 adds socket_power); each value 0xFFFF becomes "N/A"."""
    dev = _call(handle, "amdsmi_get_power_info")
    info = {"current_socket_power": dev["current_socket_power"],
            "average_socket_power": dev["average_socket_power"],
            "gfx_voltage": U16, "soc_voltage": U16, "mem_voltage": U16, "power_limit": U16}
    if _RELEASE >= (7, 0):
        info = {"socket_power": U16, **info}
    return {k: "N/A" if v == U16 else v for k, v in info.items()}


def amdsmi_get_energy_count(handle: Any) -> dict[str, Any]:
    """6.1.2: "power"; 6.3.3: "power" and "energy_accumulator"; 7.0.2: "energy_accumulator"."""
    dev = _call(handle, "amdsmi_get_energy_count")
    acc = _energy_count(dev, _calls[(_dev(handle)[0], "amdsmi_get_energy_count")])
    out: dict[str, Any] = {}
    if _RELEASE < (7, 0):
        out["power"] = acc
    if _RELEASE >= (6, 3):
        out["energy_accumulator"] = acc
    out.update(counter_resolution=dev["counter_resolution"], timestamp=int(_elapsed() * 1e9))
    return out


def amdsmi_get_temp_metric(handle: Any, sensor: AmdSmiTemperatureType,
                           metric: AmdSmiTemperatureMetric) -> int:
    return _call(handle, "amdsmi_get_temp_metric")["temps"][sensor.name]


def amdsmi_get_clock_info(handle: Any, clock: AmdSmiClkType) -> dict[str, Any]:
    """6.1.2: cur_clk, max_clk, min_clk, sleep_clk; 6.3.3: clk, min_clk, max_clk, clk_locked,
    clk_deep_sleep; 7.0.2: the same, through _validate_if_max_uint."""
    dev = _call(handle, "amdsmi_get_clock_info")
    clk = dev["clocks"][clock.name]
    if _RELEASE < (6, 3):
        return {"cur_clk": clk, "max_clk": dev["max_clk"], "min_clk": 500, "sleep_clk": 0}
    return {"clk": clk, "min_clk": 500, "max_clk": dev["max_clk"], "clk_locked": False,
            "clk_deep_sleep": 0}


def amdsmi_get_gpu_activity(handle: Any) -> dict[str, Any]:
    dev = _call(handle, "amdsmi_get_gpu_activity")
    return {"gfx_activity": dev["gfx_activity"], "umc_activity": "N/A", "mm_activity": "N/A"}


def amdsmi_get_gpu_memory_usage(handle: Any, mem_type: AmdSmiMemoryType) -> int:
    return int(_call(handle, "amdsmi_get_gpu_memory_usage")["vram_used"])


def amdsmi_get_gpu_memory_total(handle: Any, mem_type: AmdSmiMemoryType) -> int:
    return int(_call(handle, "amdsmi_get_gpu_memory_total")["vram_total"])


def _residency(dev: dict[str, Any]) -> dict[str, int]:
    """MI300 gpu_metrics: accumulation_counter (1 per ms) and residencies, uint32 in the kernel."""
    if dev.get("residency") is None:  # MI200's gpu_metrics v1.3 has none: all ones
        keys = ["prochot_residency_acc", "ppt_residency_acc", "socket_thm_residency_acc",
                "vr_thm_residency_acc", "hbm_thm_residency_acc"]
        return dict.fromkeys(["accumulation_counter", *keys], U64)
    ms = int(_elapsed() * 1e3) + dev.get("accumulation_start", 0)
    out = {"accumulation_counter": ms % 2**32}
    for key in ["prochot_residency_acc", "ppt_residency_acc", "socket_thm_residency_acc",
                "vr_thm_residency_acc", "hbm_thm_residency_acc"]:
        out[key] = int(ms * dev["residency"].get(key, 0.0)) % 2**32
    return out


def _xgmi(dev: dict[str, Any]) -> tuple[list[int], list[int]]:
    if dev.get("xgmi_kib_per_s") is None:
        return [U64] * 8, [U64] * 8
    kib = [(s + int(r * _elapsed())) % 2**64
           for s, r in zip(dev["xgmi_start"], dev["xgmi_kib_per_s"], strict=True)]
    kib += [U64] * (8 - len(kib))
    return kib, list(kib)


def amdsmi_get_gpu_metrics_info(handle: Any) -> dict[str, Any]:
    """The keys the kit reads of the real dict (6.1.2: no accumulation_counter or residency;
    6.3.3 and 7.0.2 add them), with each release's N/A conversions; throttle_status is a bool."""
    dev = _call(handle, "amdsmi_get_gpu_metrics_info")
    read, write = _xgmi(dev)
    raw = {"temperature_hotspot": dev["temps"]["HOTSPOT"],
           "current_socket_power": dev["current_socket_power"],
           "average_socket_power": dev["average_socket_power"],
           "energy_accumulator": _energy_count(dev), "throttle_status": dev["throttle_status"],
           "xgmi_read_data_acc": read, "xgmi_write_data_acc": write}
    if _RELEASE < (6, 3):  # 6.1.2's own checks
        out = dict(raw)
        for k in ("temperature_hotspot", "current_socket_power", "average_socket_power"):
            out[k] = "N/A" if out[k] == U16 else out[k]
        out["energy_accumulator"] = "N/A" if raw["energy_accumulator"] == U64 else (
            raw["energy_accumulator"])
        out["throttle_status"] = "N/A" if raw["throttle_status"] == U32 else bool(
            raw["throttle_status"])
        for k in ("xgmi_read_data_acc", "xgmi_write_data_acc"):
            out[k] = ["N/A" if v == U64 else v for v in raw[k]]
        return out
    out = {k: _validate(v, U16) for k, v in raw.items()
           if k in ("temperature_hotspot", "current_socket_power", "average_socket_power")}
    out["energy_accumulator"] = _validate(raw["energy_accumulator"], U64)
    out["throttle_status"] = _validate(raw["throttle_status"], U32, is_bool=True)
    for k in ("xgmi_read_data_acc", "xgmi_write_data_acc"):
        out[k] = _validate(raw[k], U64)
    out.update({k: _validate(v, U64) for k, v in _residency(dev).items()})
    return out


_RESIDENCY_KEYS = {"prochot_residency_acc": "prochot_thrm", "ppt_residency_acc": "ppt_pwr",
                   "socket_thm_residency_acc": "socket_thrm", "vr_thm_residency_acc": "vr_thrm",
                   "hbm_thm_residency_acc": "hbm_thrm"}


def amdsmi_get_violation_status(handle: Any) -> dict[str, Any]:
    """6.3.3 / 7.0.2 (7.0 adds the gfx_clk_below_host_limit and low_utilization entries): the C
    library reads gpu_metrics, sleeps 100 ms, reads again and takes the residencies' growth as
    a percentage of the accumulation counter's (amd_smi.cc ``amdsmi_get_violation_status``)."""
    dev = _call(handle, "amdsmi_get_violation_status")
    a = _residency(dev)
    time.sleep(0.1)
    b = _residency(dev)
    acc = b["accumulation_counter"] - a["accumulation_counter"]
    out: dict[str, Any] = {"reference_timestamp": int(time.time() * 1e6),
                           "violation_timestamp": U64, "acc_counter": b["accumulation_counter"]}
    for key, name in _RESIDENCY_KEYS.items():
        out[f"acc_{name}"] = b[key]
    for key, name in _RESIDENCY_KEYS.items():
        out[f"per_{name}"] = (b[key] - a[key]) * 100 // acc if acc > 0 else U64
    for name in _RESIDENCY_KEYS.values():
        out[f"active_{name}"] = 0xFF if acc <= 0 else int(out[f"per_{name}"] > 0)
    if _RELEASE >= (7, 0):
        out.update(acc_gfx_clk_below_host_limit=U64, per_gfx_clk_below_host_limit=U64,
                   active_gfx_clk_below_host_limit=0xFF)
    return {k: _validate(v, 0xFF if k.startswith("active_") else U64,
                         is_bool=k.startswith("active_")) for k, v in out.items()}


def _c_gpu_metrics(handle: Any, metrics_ref: Any) -> int:
    """amdsmi_wrapper.amdsmi_get_gpu_metrics_info: the raw struct, its status returned."""
    try:
        dev = _call(handle, "amdsmi_get_gpu_metrics_info")
    except AmdSmiLibraryException as e:
        return e.err_code
    metrics_ref._obj.throttle_status = dev["throttle_status"]
    return amdsmi_wrapper.AMDSMI_STATUS_SUCCESS


if _RELEASE < (6, 3):  # added in 6.3
    del amdsmi_get_violation_status
if _RELEASE < (6, 1):  # ROCm 5.5 named these differently (amdsmi_get_device_handles, ...)
    del __version__  # and had no _version.py
    for _name in ("amdsmi_get_processor_handles", "amdsmi_get_gpu_asic_info",
                  "amdsmi_get_power_info", "amdsmi_get_energy_count", "amdsmi_get_temp_metric",
                  "amdsmi_get_clock_info", "amdsmi_get_gpu_memory_usage",
                  "amdsmi_get_gpu_metrics_info"):
        del globals()[_name]
