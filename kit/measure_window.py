"""How long a measured phase must last for its power figures to mean something.

Peaks, peak-to-mean and excursions rest on the instantaneous power samples, energy on the
counter's readings; a window of a few samples gives a maximum that cannot be compared with one
over many. The minimums here are what ``metrics.json`` checks each device's window against
(``window_short``), and what a run's measured phase extends itself to by default
(``RunConfig.min_measured_s``). docs/metrics.md says why each number.
"""

MIN_POWER_SAMPLES = 100
"""Fewest power samples per device for peak, peak-to-mean and excursions: a power state that
holds for 5% of the measured time is then missed by every sample with probability
0.95^100 < 0.6%. At the default 20 ms that is 2 s of measured steps."""

MIN_COUNTER_READINGS = 8
"""Fewest energy-counter readings per device over the measured span (the two that bracket it
included). NVML refreshes the counter about every 100 ms, so the readings at the span's two
edges are each stale by up to one refresh; at the sampler's read period (:data:`COUNTER_READ_S`)
eight readings mean a span of 4 s or more, over which two stale edges can shift the rise by at
most 5% and typically (one standard deviation of the difference of two uniform delays, 41 ms)
by 1%."""

COUNTER_READ_S = 0.5
"""The period the sampler's slow lanes read the energy counter at
(:data:`kit.telemetry.nvidia.candidates.SLOW_READ_MS`)."""

MAX_EXTENSION = 20
"""A run extends its measured phase to at most this many times the measured steps it was asked
for: a bound on how long a run whose steps are far shorter than asked can take."""


def default_min_measured_s(telemetry_interval_ms: int, device_telemetry: bool) -> float:
    """Seconds of measured steps a run extends itself to when not told otherwise.

    Enough for :data:`MIN_POWER_SAMPLES` samples at the run's period and
    :data:`MIN_COUNTER_READINGS` counter readings; 0 without device telemetry (a CPU host, or
    telemetry off), where there are no such figures to protect.
    """
    if not device_telemetry or telemetry_interval_ms <= 0:
        return 0.0
    return max(MIN_POWER_SAMPLES * telemetry_interval_ms / 1000.0,
               MIN_COUNTER_READINGS * COUNTER_READ_S)
