"""The kit's memory estimate against the measured peak, for several configurations, one GPU.

Each configuration trains a few steps through the kit's megatron engine in this process;
``torch.cuda.max_memory_allocated`` is compared with ``kit.analysis.memory``'s estimate of
allocated tensor bytes (no CUDA context or allocator slack, which the allocator does not
count either). Prints a table and, with ``--json``, writes it.

    python benchmarks/memory_check.py --json memory_check.json
"""

import argparse
import datetime as dt
import json

import torch

from benchmarks.engine_throughput import fresh_memory, kit_engine
from kit.analysis.memory import estimate_vs_measured
from kit.spec.detect import detect_platform
from kit.spec.resolve import RunRequest, resolve

CONFIGS: tuple[dict, ...] = (
    {"workload": "gpt3-small", "micro_batch_size": 8, "global_batch_size": 16},
    {"workload": "gpt3-1.3b", "micro_batch_size": 4, "global_batch_size": 16},
    {"workload": "gpt3-1.3b", "micro_batch_size": 4, "global_batch_size": 16,
     "recompute": "selective"},
    {"workload": "gpt3-1.3b", "micro_batch_size": 8, "global_batch_size": 16,
     "recompute": "full"},
    {"workload": "gpt3-2.7b", "micro_batch_size": 2, "global_batch_size": 8},
)


def main() -> None:
    """Measure every configuration of :data:`CONFIGS` and print estimate vs measured."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    platform = detect_platform().name
    device = torch.cuda.get_device_name()
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ} {device}", flush=True)
    rows = []
    for c in CONFIGS:
        req = RunRequest(platform=platform, steps=2, warmup=2, telemetry_interval_ms=0, **c)
        with fresh_memory():
            measured = kit_engine(req)
        row = {**c, **estimate_vs_measured(resolve(req, require_present=True),
                                           int(measured["peak_mem_gib"] * 2**30))}
        rows.append(row)
        label = " ".join(f"{k}={v}" for k, v in c.items())
        print(f"{label:80s} estimate {row['estimate_gib']:7.2f} GiB  measured "
              f"{row['measured_gib']:7.2f} GiB  error {row['error']:+6.1%}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "date": f"{dt.date.today()}", "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
