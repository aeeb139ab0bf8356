"""Whether a point's measured steps are free of its start: its first measured step against the
median of them.

A step that still compiles, allocates or captures a CUDA graph lands in the measured phase when
the warmup was too short, and lifts the point's energy per token and lowers its mean power for
reasons that are not the layout's. The study checks every GPU point after the matrix ran and
runs each one that fails once more with :data:`RERUN_WARMUP_FACTOR` times the warmup
(:mod:`kit.study.run`); the findings then read the rerun, and the findings file records both.
"""

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.bundle.reader import read_bundle
from kit.errors import BundleError
from kit.metrics.summary import step_spans

FIRST_STEP_EXCESS = 0.10
"""How much slower than the median of the measured steps the first one may be. Steady steps of
one point vary by about 1-3% (one H100, gpt3-2.7b: 1.508-1.510 s, 0.223-0.233 s); a capture or
an allocation in the step costs its length again or more (4.4 s against 1.2 s)."""
RERUN_WARMUP_FACTOR = 2
"""A point that fails the check runs once more with this many times its warmup steps."""


@dataclass(frozen=True)
class WarmupCheck:
    """One point's first measured step against the median of its measured steps.

    Attributes:
        point: The sweep point id.
        bundle: The bundle's folder name.
        warmup: Its warmup steps.
        first_s: Its first measured step, seconds (earliest rank's start to latest rank's end).
        median_s: The median of its measured steps, seconds (the bundle's ``step_time_s``).
    """

    point: str
    bundle: str
    warmup: int
    first_s: float
    median_s: float

    @property
    def excess(self) -> float:
        """How much slower than the median the first measured step was (0.1 = 10%)."""
        return self.first_s / self.median_s - 1

    @property
    def ok(self) -> bool:
        """Whether the first measured step is within :data:`FIRST_STEP_EXCESS` of the median."""
        return self.excess <= FIRST_STEP_EXCESS

    def describe(self) -> str:
        """``first measured step 4.37 s against a median of 1.20 s (+264%) after 1 warmup``."""
        return (f"first measured step {self.first_s:.3g} s against a median of "
                f"{self.median_s:.3g} s ({self.excess:+.0%}) after {self.warmup} warmup")

    def as_json(self) -> dict[str, Any]:
        """The findings file's record of the check."""
        return {"point": self.point, "bundle": self.bundle, "warmup": self.warmup,
                "first_step_s": round(self.first_s, 4), "median_step_s": round(self.median_s, 4),
                "ok": self.ok}


def check_warmup(point: str, bundle: Path) -> WarmupCheck | None:
    """The check of ``point``'s bundle; None where it cannot be made (an unreadable bundle, or
    fewer than 3 measured steps: a median of 2 is their mean, which the first pulls with it)."""
    try:
        b = read_bundle(bundle)
        spans = step_spans(b.steps)
    except BundleError:
        return None
    if len(spans) < 3:
        return None
    durations = [end - start for _, (start, end) in sorted(spans.items())]
    return WarmupCheck(point, bundle.name, int(b.manifest.config.get("warmup") or 0), durations[0],
                       statistics.median(durations))


def rerun_values(values: dict[str, Any], warmup: int) -> dict[str, Any]:
    """The point's values for its rerun: :data:`RERUN_WARMUP_FACTOR` times ``warmup``."""
    return {**values, "warmup": max(1, warmup) * RERUN_WARMUP_FACTOR}
