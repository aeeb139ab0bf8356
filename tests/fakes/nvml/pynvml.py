"""Fake ``pynvml`` (nvidia-ml-py) for CPU tests: the real module's constants, structures and
error classes, with the device calls answered from a JSON scenario instead of libnvidia-ml.

The real nvidia-ml-py (a dependency of the kit) is loaded under another name, so every
constant, ``NVMLError`` subclass and ctypes structure (``c_nvmlFieldValue_t``,
``c_nvmlUtilization_t``, ``c_nvmlMemory_t``, ``c_nvmlViolationTime_t``) is the library's own;
each fake call returns what the real call of the same name returns (see its body in pynvml.py).

Scenario (``$CHARLLM_FAKE_NVML_SCENARIO``)::

    {"devices": [{
        "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-...", "arch": "NVML_DEVICE_ARCH_HOPPER",
        "power_limit_mw": 700000, "max_sm_mhz": 1980, "memory_total": 85520809984,
        "calls": {"nvmlDeviceGetPowerUsage": [500000], "nvmlDeviceGetTotalEnergyConsumption":
                  [1000, 1050], ...},
        "fields": {"NVML_FI_DEV_PCIE_COUNT_TX_BYTES": {"type": "NVML_VALUE_TYPE_UNSIGNED_INT",
                   "values": [1, 2, 3]}, ...},
        "nvlinks": 0}]}

A ``calls`` or ``fields`` entry gives successive answers, one per call, the last repeated; a
field-value entry is ``{"scope": {"<scope id>": {...}}}`` for per-link counters; a field or call
the scenario lacks answers NVML_ERROR_NOT_SUPPORTED. Violation times are listed per policy:
``"nvmlDeviceGetViolationStatus": {"0": [...], "1": [...]}`` (ns). ``"sleep_s": {"<call or
field constant>": 0.01}`` makes each such call (a field-values request: the longest of its
fields') take that long, as NVML's slow queries do (releasing the GIL, as ctypes calls do).
"""

import importlib.machinery
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

_HERE = str(Path(__file__).resolve().parent)


def _load_real() -> Any:
    """The installed nvidia-ml-py, imported under another name (this file shadows it)."""
    path = [p for p in sys.path if str(Path(p or ".").resolve()) != _HERE]
    found = importlib.machinery.PathFinder.find_spec("pynvml", path)
    assert found is not None and found.origin, "nvidia-ml-py is not installed"
    spec = importlib.util.spec_from_file_location("_real_pynvml", found.origin)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pynvml looks itself up there while it loads
    spec.loader.exec_module(module)
    return module


_real = _load_real()
globals().update({k: v for k, v in vars(_real).items()
                  if k.startswith(("NVML", "nvmlClocks", "c_nvml", "NVMLError"))})
NVMLError = _real.NVMLError

_scenario: dict[str, Any] = {}
_counts: dict[tuple[int, str], int] = {}


def _next(handle: int, key: str, answers: list[Any]) -> Any:
    """Successive answers of one call on one device, the last repeated."""
    n = _counts.get((handle, key), 0)
    _counts[(handle, key)] = n + 1
    return answers[min(n, len(answers) - 1)]


def _device(handle: int) -> dict[str, Any]:
    return _scenario["devices"][handle]


def _sleep(handle: int, *names: str) -> None:
    """Take as long as the scenario says the slowest of these calls or fields takes."""
    sleeps = _device(handle).get("sleep_s", {})
    time.sleep(max((sleeps.get(n, 0.0) for n in names), default=0.0))


def _call(handle: int, name: str) -> Any:
    _sleep(handle, name.split("/")[0])
    answers = _device(handle).get("calls", {}).get(name)
    if answers is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # noqa: F821 - from the real module
    answer = _next(handle, name, answers)
    if isinstance(answer, str):  # an error constant's name: the call fails with it
        raise NVMLError(getattr(_real, answer))
    return answer


def nvmlInit() -> None:
    """Read the scenario, as nvmlInit loads the library."""
    _scenario.clear()
    _counts.clear()
    _scenario.update(json.loads(Path(os.environ["CHARLLM_FAKE_NVML_SCENARIO"]).read_text()))


def nvmlShutdown() -> None:
    """Nothing to release."""


def nvmlDeviceGetCount() -> int:
    return len(_scenario["devices"])


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < len(_scenario["devices"]):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # noqa: F821
    return index


def nvmlDeviceGetArchitecture(handle: int) -> int:
    return getattr(_real, _device(handle)["arch"])


def nvmlDeviceGetName(handle: int) -> str:
    return _device(handle)["name"]


def nvmlDeviceGetUUID(handle: int) -> str:
    return _device(handle)["uuid"]


def nvmlDeviceGetEnforcedPowerLimit(handle: int) -> int:
    return _device(handle)["power_limit_mw"]


def nvmlDeviceGetMaxClockInfo(handle: int, clock: int) -> int:
    return _device(handle)["max_sm_mhz"]


def nvmlDeviceGetNvLinkState(handle: int, link: int) -> int:
    if link >= _device(handle).get("nvlinks", 0):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # noqa: F821
    return NVML_FEATURE_ENABLED  # noqa: F821


def nvmlDeviceGetFieldValues(handle: int, field_ids: list[Any]) -> Any:
    """A ``c_nvmlFieldValue_t`` array; each entry carries its own nvmlReturn, as in NVML."""
    named = {getattr(_real, name): name for name in _device(handle).get("fields", {})}
    by_id = {getattr(_real, name): spec for name, spec in _device(handle).get("fields", {}).items()}
    _sleep(handle, *(named.get(fid[0] if isinstance(fid, tuple) else fid, "") for fid in field_ids))
    values = (_real.c_nvmlFieldValue_t * len(field_ids))()
    for v, fid in zip(values, field_ids, strict=True):
        field_id, scope = fid if isinstance(fid, tuple) else (fid, 0)
        v.fieldId, v.scopeId = field_id, scope
        spec = by_id.get(field_id)
        if spec is not None and "scope" in spec:
            spec = spec["scope"].get(str(scope))
        if spec is None:
            v.nvmlReturn = NVML_ERROR_NOT_SUPPORTED  # noqa: F821
            continue
        v.nvmlReturn = NVML_SUCCESS  # noqa: F821
        v.valueType = getattr(_real, spec["type"])
        attr = {"NVML_VALUE_TYPE_DOUBLE": "dVal", "NVML_VALUE_TYPE_UNSIGNED_INT": "uiVal",
                "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": "ullVal"}[spec["type"]]
        setattr(v.value, attr, _next(handle, f"{field_id}/{scope}", spec["values"]))
    return values


def nvmlDeviceGetPowerUsage(handle: int) -> int:
    return _call(handle, "nvmlDeviceGetPowerUsage")


def nvmlDeviceGetTotalEnergyConsumption(handle: int) -> int:
    return _call(handle, "nvmlDeviceGetTotalEnergyConsumption")


def nvmlDeviceGetTemperature(handle: int, sensor: int) -> int:
    return _call(handle, "nvmlDeviceGetTemperature")


def nvmlDeviceGetClockInfo(handle: int, clock: int) -> int:
    return _call(handle, f"nvmlDeviceGetClockInfo/{clock}")


def nvmlDeviceGetUtilizationRates(handle: int) -> Any:
    util = _real.c_nvmlUtilization_t()
    util.gpu = _call(handle, "nvmlDeviceGetUtilizationRates")
    return util


def nvmlDeviceGetMemoryInfo(handle: int) -> Any:
    memory = _real.c_nvmlMemory_t()
    memory.total = _device(handle)["memory_total"]
    memory.used = _call(handle, "nvmlDeviceGetMemoryInfo")
    return memory


def nvmlDeviceGetCurrentClocksEventReasons(handle: int) -> int:
    return _call(handle, "nvmlDeviceGetCurrentClocksEventReasons")


def nvmlDeviceGetViolationStatus(handle: int, policy: int) -> Any:
    _sleep(handle, "nvmlDeviceGetViolationStatus")
    answers = _device(handle).get("calls", {}).get("nvmlDeviceGetViolationStatus", {})
    if str(policy) not in answers:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # noqa: F821
    viol = _real.c_nvmlViolationTime_t()
    viol.violationTime = _next(handle, f"viol/{policy}", answers[str(policy)])
    return viol
