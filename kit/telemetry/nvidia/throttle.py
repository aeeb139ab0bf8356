"""NVML clocks-event (throttle) reasons decoded into the kit's vendor-neutral throttle bits."""

from functools import lru_cache

from kit.bundle.telemetry_fields import THROTTLE_BITS

_OTHER = THROTTLE_BITS["other"]

# Newer NVML renamed nvmlClocksThrottleReason* to nvmlClocksEventReason* (same values);
# nvidia-ml-py keeps both for now, older releases have only the old names. BoardLimit and
# Reliability exist only under the old prefix and have no kit bit: they count as "other".

_NVML_PREFIXES = ("nvmlClocksEventReason", "nvmlClocksThrottleReason")

_NVML_TO_KIT: dict[str, int] = {
    "SwPowerCap": THROTTLE_BITS["power_cap"],
    "SwThermalSlowdown": THROTTLE_BITS["thermal_sw"],
    "HwThermalSlowdown": THROTTLE_BITS["thermal_hw"],
    "HwSlowdown": THROTTLE_BITS["hw_slowdown"],
    "HwPowerBrakeSlowdown": THROTTLE_BITS["power_brake"],
    # SyncBoost: clocks held to the slowest GPU of a sync-boost group; DisplayClockSetting:
    # clocks held by the display clock. Both really limit clocks, but have no kit bit.
    "SyncBoost": _OTHER,
    "DisplayClockSetting": _OTHER,
    # Not throttling, so they map to no bit. GpuIdle: clocks are low because no work is
    # queued, which is the absence of load rather than a limit on it (every idle sample would
    # otherwise count as throttled). ApplicationsClocksSetting: clocks sit at the application
    # clocks someone configured (nvidia-smi -ac), a chosen operating point reported whenever
    # it is below boost, not a reaction to power or temperature.
    "GpuIdle": 0,
    "ApplicationsClocksSetting": 0,
}


@lru_cache(maxsize=1)
def _nvml_bit_map() -> dict[int, int]:
    """NVML reason bit -> kit bit, from the installed pynvml's own constants.

    Imported here, not at module level, so that importing this module works without
    nvidia-ml-py; only the NVML backend, which has already imported it, calls the decoder.
    """
    import pynvml

    bit_map: dict[int, int] = {}
    for reason, kit_bit in _NVML_TO_KIT.items():
        names = [p + reason for p in _NVML_PREFIXES if hasattr(pynvml, p + reason)]
        values = {getattr(pynvml, name) for name in names}
        if len(values) != 1:
            raise RuntimeError(f"pynvml defines clocks-event reason {reason} as {values}")
        bit_map[values.pop()] = kit_bit
    return bit_map


def decode_nvml_clocks_event_reasons(mask: int) -> int:
    """Map an NVML clocks-event (throttle) reason mask to the kit's throttle bits.

    Args:
        mask: What ``nvmlDeviceGetCurrentClocksEventReasons`` (formerly
            ``...ClocksThrottleReasons``) returned.

    Returns:
        An OR of :data:`~kit.bundle.schema.THROTTLE_BITS`; 0 when the GPU is idle, at its
        application clocks or not limited at all. Any NVML bit not known here sets ``other``.
    """
    bits = 0
    for nvml_bit, kit_bit in _nvml_bit_map().items():
        if mask & nvml_bit:
            bits |= kit_bit
            mask &= ~nvml_bit
    return bits | (_OTHER if mask else 0)
