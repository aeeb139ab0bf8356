"""Missed ticks of the real sampler on the CPU host, every core busy (issue 33's 1% goal).

    PYTHONPATH=$PWD python benchmarks/telemetry/missed_ticks_cpu.py [SECONDS] [RUNS]

The sampler process samples the fake NVML of tests/fakes (4 H100s, each slow query 2 ms) and
the host at 20 ms, with its default chunk settings (2000 rows or 2 s), while one busy loop per
core competes for the CPU, as training ranks do on a GPU node. Prints, per run, the ticks, the
ticks missed and the chunks written.
"""

import multiprocessing
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from kit.telemetry.sampler import TelemetrySampler
from tests.fakes import fake_library
from tests.test_telemetry_nvml import SLOW_QUERIES, eight_slow_h100s


def _spin(until: float) -> None:
    while time.monotonic() < until:
        pass


def run(seconds: float, tmp: Path) -> str:
    """One run of the sampler beside a busy loop per core; its line of figures."""
    scenario = eight_slow_h100s()
    scenario["devices"] = scenario["devices"][:4]
    for device in scenario["devices"]:
        device["sleep_s"] = dict.fromkeys(SLOW_QUERIES, 0.002)
    with pytest.MonkeyPatch.context() as mp, fake_library(mp, "pynvml", scenario, tmp):
        hogs = [multiprocessing.Process(target=_spin, args=(time.monotonic() + seconds + 5,))
                for _ in range(os.cpu_count() or 1)]
        for h in hogs:
            h.start()
        sampler = TelemetrySampler([("nvml", {"node": 0}), ("host", {"node": 0})],
                                   interval_ms=20, chunks_dir=tmp / "chunks")
        sampler.start()
        time.sleep(seconds)
        r = sampler.stop()
        for h in hogs:
            h.terminate()
            h.join()
    return (f"ticks {r.ticks}, missed {r.missed_ticks} ({r.missed_ticks / r.ticks:.2%}), "
            f"chunks {r.chunks}, mean period {r.mean_period_ms:.2f} ms, sampler CPU "
            f"{r.cpu_s:.2f} s over {r.wall_s:.1f} s")


def main(seconds: float, runs: int) -> None:
    """Print the host and date, then each run's figures."""
    print(f"date: {datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}, {os.cpu_count()} cores, "
          f"load average before {os.getloadavg()[0]:.1f}, {seconds:.0f} s per run")
    for i in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            print(f"run {i + 1}: {run(seconds, Path(tmp))}", flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 20.0,
         int(sys.argv[2]) if len(sys.argv) > 2 else 3)
