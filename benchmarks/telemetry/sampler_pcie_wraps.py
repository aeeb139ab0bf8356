"""The real sampler process on one GPU under PCIe load: are NVML's 32-bit counters unwrapped?

    python3 benchmarks/telemetry/sampler_pcie_wraps.py

Runs ``TelemetrySampler`` with the nvml and host sources at 20 ms for 4 s while a thread copies
256 MiB host -> cuda:0 and back in a loop (about 24 GB/s each way on one H100: NVML's 32-bit
PCIe counters wrap several times a second), then prints, per cumulative field of the GPU rows,
how many values were written and whether they never decrease, and the sampler's errors and
period. The reason printed is the one the sampler records at start (it reads ``fields()`` once).
Run from the repository root with the kit importable.
"""

import threading
import time
from pathlib import Path

import torch

from kit.bundle.writer import concat_chunks
from kit.telemetry.sampler import TelemetrySampler

CHUNKS = Path("/tmp/chunks2")
"""Where the sampler writes; must not exist yet."""


def copy(stop: threading.Event) -> None:
    """Copy 256 MiB host -> cuda:0 -> host until ``stop``."""
    h = torch.empty(64 * 2**20).pin_memory()
    d = torch.empty_like(h, device="cuda:0")
    while not stop.is_set():
        d.copy_(h, non_blocking=True)
        h.copy_(d, non_blocking=True)
        torch.cuda.synchronize()


def main() -> None:
    """Sample for 4 s under the copy loop and print what the GPU rows hold."""
    stop = threading.Event()
    w = threading.Thread(target=copy, args=(stop,), daemon=True)
    w.start()
    try:
        s = TelemetrySampler([("nvml", {"node": 0}), ("host", {"node": 0})], interval_ms=20,
                             chunks_dir=CHUNKS)
        s.start()
        time.sleep(4)
        r = s.stop()
    finally:
        stop.set()
        w.join(10)
    rows = [x for x in concat_chunks(CHUNKS).to_pylist() if x["source"] == "gpu"]
    for f in ("pcie_tx_bytes", "pcie_rx_bytes", "energy_j", "viol_power_s"):
        v = [x[f] for x in rows if x[f] is not None]
        monotone = all(b >= a for a, b in zip(v, v[1:], strict=False))
        print(f, len(v), "non-decreasing", monotone, v[0], v[-1])
    print("errors", r.errors, "ticks", r.ticks, "mean_period_ms", round(r.mean_period_ms, 2))
    print("start-of-run pcie_tx_bytes reason:", r.sources["nvml"]["pcie_tx_bytes"].reason)


if __name__ == "__main__":
    main()
