"""NVML backend and throttle decoding, with nvidia-ml-py's real constants and errors.

On a host without an NVIDIA driver (CI) the backend must refuse to start with a how-to-fix
message; on a GPU host the same tests instead check real rows.
"""

import subprocess
import sys

import pynvml
import pytest

from kit.bundle.schema import THROTTLE_BITS
from kit.telemetry import SOURCES, TelemetryNotSupportedError, build_source
from kit.telemetry.fields import TELEMETRY_COLUMNS
from kit.telemetry.throttle import decode_nvml_clocks_event_reasons, reason_names


def _reason(name: str) -> int:
    """An NVML clocks-event reason bit, by whichever name this pynvml has."""
    for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
        if hasattr(pynvml, prefix + name):
            return getattr(pynvml, prefix + name)
    raise AttributeError(name)


def _nvml_starts() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


HAS_NVML = _nvml_starts()


@pytest.mark.parametrize(
    ("reason", "kit_bit"),
    [
        ("SwPowerCap", "power_cap"),
        ("SwThermalSlowdown", "thermal_sw"),
        ("HwThermalSlowdown", "thermal_hw"),
        ("HwSlowdown", "hw_slowdown"),
        ("HwPowerBrakeSlowdown", "power_brake"),
        ("SyncBoost", "other"),
        ("DisplayClockSetting", "other"),
    ],
)
def test_single_nvml_reason(reason: str, kit_bit: str) -> None:
    bits = decode_nvml_clocks_event_reasons(_reason(reason))
    assert bits == THROTTLE_BITS[kit_bit]
    assert reason_names(bits) == [kit_bit]


@pytest.mark.parametrize("reason", ["None", "GpuIdle", "ApplicationsClocksSetting"])
def test_not_throttling_decodes_to_zero(reason: str) -> None:
    assert decode_nvml_clocks_event_reasons(_reason(reason)) == 0
    assert reason_names(0) == []


def test_combined_mask() -> None:
    mask = (
        _reason("GpuIdle")
        | _reason("SwPowerCap")
        | _reason("HwThermalSlowdown")
        | _reason("HwPowerBrakeSlowdown")
    )
    bits = decode_nvml_clocks_event_reasons(mask)
    assert reason_names(bits) == ["power_cap", "thermal_hw", "power_brake"]


def test_every_known_reason_at_once() -> None:
    assert decode_nvml_clocks_event_reasons(pynvml.nvmlClocksThrottleReasonAll) == sum(
        THROTTLE_BITS.values()
    )


@pytest.mark.parametrize("unknown", [1 << 40, 1 << 63])
def test_unknown_bit_is_other(unknown: int) -> None:
    assert decode_nvml_clocks_event_reasons(unknown) == THROTTLE_BITS["other"]
    mixed = decode_nvml_clocks_event_reasons(unknown | _reason("SwThermalSlowdown"))
    assert reason_names(mixed) == ["thermal_sw", "other"]


def test_old_only_reasons_are_other() -> None:
    # BoardLimit and Reliability exist only under the old "Throttle" prefix and have no kit bit.
    for name in ("nvmlClocksThrottleReasonBoardLimit", "nvmlClocksThrottleReasonReliability"):
        if hasattr(pynvml, name):
            assert decode_nvml_clocks_event_reasons(getattr(pynvml, name)) == THROTTLE_BITS["other"]


@pytest.mark.parametrize("bits", [64, -1])
def test_reason_names_rejects_non_kit_bits(bits: int) -> None:
    with pytest.raises(ValueError, match="not a kit throttle bitmask"):
        reason_names(bits)


def test_registered() -> None:
    assert SOURCES["nvml"] == "kit.telemetry.nvml:NvmlSource"


def test_import_does_not_load_pynvml() -> None:
    code = (
        "import sys, kit.telemetry.nvml, kit.telemetry.throttle; "
        "assert 'pynvml' not in sys.modules, 'pynvml imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(HAS_NVML, reason="NVML starts on this host")
@pytest.mark.parametrize("how", ["class", "registry"])
def test_refuses_without_driver(how: str) -> None:
    from kit.telemetry.nvml import NvmlSource

    with pytest.raises(TelemetryNotSupportedError) as err:
        NvmlSource(node=0) if how == "class" else build_source("nvml", node=0)
    # The real NVML error, converted at the boundary, with what to do about it.
    assert isinstance(err.value.__cause__, pynvml.NVMLError)
    message = str(err.value)
    assert message.startswith("NVML did not start (nvmlInit): ")
    assert "install the NVIDIA driver" in message or "driver is not loaded" in message


@pytest.mark.skipif(not HAS_NVML, reason="no NVIDIA driver on this host")
def test_samples_real_gpus() -> None:
    source = build_source("nvml", node=3)
    try:
        fields = source.fields()
        devices = source.devices()
        rows = source.sample(123.0) + source.sample(124.0)
    finally:
        source.close()
    assert {"power_w", "energy_j", "throttle", "link_tx_bytes"} <= set(fields)
    assert all(info.reason for info in fields.values() if not info.readable)
    assert devices and all(d["power_limit_w"] > 0 for d in devices)
    assert len(rows) == 2 * len(devices)
    for row in rows:
        assert list(row) == list(TELEMETRY_COLUMNS)
        assert (row["node"], row["source"]) == (3, "gpu")
        for name, info in fields.items():
            if not info.readable:
                assert row[name] is None, name
    assert all(r["energy_j"] > 0 and 0 < r["power_w"] < 2000 for r in rows)


@pytest.mark.skipif(not HAS_NVML, reason="no NVIDIA driver on this host")
def test_rejects_missing_device() -> None:
    with pytest.raises(TelemetryNotSupportedError, match="cannot sample devices"):
        build_source("nvml", node=0, devices=[999])
