"""Run the node sampler (NVML + host) alone for a while, e.g. beside a NCCL training run.

    PYTHONFAULTHANDLER=1 python3 benchmarks/telemetry/sampler_under_load.py \
        SECONDS INTERVAL_MS NVLINK(0|1) OUT_DIR

Prints the sampler report: ticks, achieved period, missed ticks, errors, and how the process
ended. Used to find what makes the sampler slow or crash on multi-GPU nodes.
"""

import sys
import time
from pathlib import Path

from kit.bundle.writer import concat_chunks
from kit.telemetry.sampler import TelemetrySampler


def main() -> None:
    """Sample for the given time and print the report."""
    seconds, interval_ms, nvlink, out = (float(sys.argv[1]), int(sys.argv[2]),
                                         sys.argv[3] == "1", Path(sys.argv[4]))
    out.mkdir(parents=True, exist_ok=True)
    sampler = TelemetrySampler([("nvml", {"node": 0, "nvlink": nvlink}), ("host", {"node": 0})],
                               interval_ms=interval_ms, chunks_dir=out, chunk_rows=200)
    sampler.start()
    time.sleep(seconds)
    try:
        r = sampler.stop()
        print(f"nvlink={nvlink}: ticks {r.ticks}, mean period {r.mean_period_ms} ms, missed "
              f"{r.missed_ticks}, rows {r.rows_written}, errors {r.errors}")
    except Exception as e:
        print(f"nvlink={nvlink}: sampler failed: {e}")
    t = concat_chunks(out)
    gpu = t.filter(t["source"] == "gpu").to_pandas()
    print(gpu.groupby("device")[["power_w", "link_tx_bytes", "link_rx_bytes", "pcie_tx_bytes"]]
          .agg(["min", "max"]).to_string())


if __name__ == "__main__":
    main()
