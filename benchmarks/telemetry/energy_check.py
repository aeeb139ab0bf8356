"""Check a GPU bundle's energy three ways and list the throttle reasons it saw.

    python3 benchmarks/telemetry/energy_check.py BUNDLE

Over the measured steps of each device: (1) the NVML hardware energy counter (last minus first
sample inside each step window, summed), (2) sampled instantaneous power integrated over the same
windows (trapezoid), (3) Zeus's per-step windows recorded by the rank driving the device. Prints
the differences in percent, the sampling period achieved and the decoded throttle reasons.
"""

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from kit.bundle.telemetry_fields import THROTTLE_BITS
from kit.metrics.summary import step_spans


def main(bundle: Path) -> None:
    """Print the energy comparison for ``bundle``."""
    steps = pq.read_table(bundle / "steps.parquet")
    tele = pq.read_table(bundle / "telemetry.parquet").to_pandas()
    spans = sorted(step_spans(steps).values())
    gpu = tele[tele["source"] == "gpu"]
    zeus = steps.to_pandas()
    zeus = zeus[zeus["phase"] == "measured"]
    print(f"bundle {bundle.name}: {len(spans)} measured steps, {len(gpu)} GPU samples")
    for dev, rows in gpu.groupby("device"):
        rows = rows.sort_values("t")
        t_power = rows.dropna(subset=["power_w"])["t"].to_numpy()
        print(f"device {dev}: median sample period {np.median(np.diff(t_power)) * 1e3:.1f} ms")
        # The measured phase as one interval, between its first and last counter reading
        # (the counter is read at its own slower period, power every tick): the counter's rise
        # there against the trapezoidal integral of sampled power over the same interval.
        inside = rows[(rows["t"] >= spans[0][0]) & (rows["t"] <= spans[-1][1])]
        readings = inside.dropna(subset=["energy_j"])
        t0, t1 = readings["t"].iloc[0], readings["t"].iloc[-1]
        counter = readings["energy_j"].iloc[-1] - readings["energy_j"].iloc[0]
        w = inside[(inside["t"] >= t0) & (inside["t"] <= t1)].dropna(subset=["power_w"])
        tw, pw = w["t"].to_numpy(), w["power_w"].to_numpy()
        integrated = float(np.sum(np.diff(tw) * (pw[1:] + pw[:-1]) / 2))
        print(f"  NVML energy counter      {counter:10.1f} J")
        print(f"  integrated power_w       {integrated:10.1f} J  "
              f"({100 * (integrated - counter) / counter:+.2f}% vs counter)")
        z = zeus[zeus["rank"] == dev]["gpu_energy_j"].dropna()
        if len(z):
            print(f"  Zeus step windows        {z.sum():10.1f} J  "
                  f"({100 * (z.sum() - counter) / counter:+.2f}% vs counter; windows span the "
                  "steps only, the counter the phase between its first and last reading)")
        seen: Counter[str] = Counter()
        masks = rows["throttle"].dropna().astype(int)
        for mask in masks:
            for name, bit in THROTTLE_BITS.items():
                if mask & bit:
                    seen[name] += 1
        share = {k: f"{v / len(masks):.1%}" for k, v in seen.items()}
        print(f"  throttle reasons seen (share of samples): {share or 'none'}")
        print(f"  power_w mean {rows['power_w'].mean():.0f} W, max {rows['power_w'].max():.0f} W; "
              f"temp max {rows['temp_gpu_c'].max():.0f} C; "
              f"SM clock {rows['clock_sm_mhz'].min():.0f}-{rows['clock_sm_mhz'].max():.0f} MHz")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
