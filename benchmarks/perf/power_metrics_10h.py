"""How long power attribution and per-device metrics take on 10 hours of 8-GPU telemetry.

2M samples at 20 ms on 8 devices (16M rows, 11 hours) and ~56k steps of 8 ranks, the synthetic
run of tests/test_power_metrics.py (whose test checks the figures on a shorter one). Measured
2.5-4.5 s on the 2-core CI host; the report reads it for every bundle it draws.

    PYTHONPATH=$PWD python3 benchmarks/perf/power_metrics_10h.py [--samples N]
"""

import argparse
import os
import time
from datetime import datetime, timezone

from kit.metrics.attribution import attribute_samples
from kit.metrics.power import device_metrics
from tests.test_power_metrics import synthetic


def main() -> None:
    """Time attribution and device metrics of the synthetic run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2_000_000)
    args = parser.parse_args()
    print(f"# {datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ} {args.samples} samples x 8 devices;"
          f" {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    tele, st = synthetic(args.samples, 8)
    facts = [{"node": 0, "device": d, "power_limit_w": 800.0, "clock_sm_max_mhz": 1980.0}
             for d in range(8)]
    start = time.perf_counter()
    attribute_samples(tele, st)
    attributed_s = time.perf_counter() - start
    device_metrics(tele, st, facts, tokens_per_step=1)
    total_s = time.perf_counter() - start
    print(f"{tele.num_rows:,} telemetry rows, {st.num_rows:,} step rows: attribution "
          f"{attributed_s:.2f} s, with device metrics {total_s:.2f} s")


if __name__ == "__main__":
    main()
