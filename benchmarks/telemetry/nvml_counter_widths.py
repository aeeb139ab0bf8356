"""NVML counter widths: the value type each cumulative field value comes back in, on this GPU.

    python3 benchmarks/telemetry/nvml_counter_widths.py

``kit/telemetry/nvidia/device.py`` unwraps each cumulative counter at the width of the value type
NVML returns it in (``c_nvmlFieldValue_t.valueType``), read at run time. This prints that type for
every field value the kit reads, per device, so the widths the CI fakes assume
(``tests/fakes/nvml``: PCIe byte counters as 32-bit ``uiVal``) can be checked against a real
driver. Then it reads every field of ``NvmlSource`` (``sample_once``: the fast ones and the
slow counters) every 20 ms while a copy loop moves 256 MiB host -> cuda:0 and back, over and
over, for 3 s, and compares each PCIe counter's advance with the bytes the loop copied (TX:
device to host, RX: host to device), and prints the wraps ``fields()`` reports. Run from the
repository root with the kit importable.
"""

import importlib.metadata
import threading
import time

import pynvml
import torch

from kit.telemetry.base import sample_once
from kit.telemetry.nvidia.nvml import NvmlSource

FIELDS = ("NVML_FI_DEV_POWER_INSTANT", "NVML_FI_DEV_POWER_AVERAGE", "NVML_FI_DEV_MEMORY_TEMP",
          "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
          "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX")
"""The field values NvmlSource reads (NVLink ones with scope = link 0 here)."""

TYPE_NAMES = {getattr(pynvml, n): n.removeprefix("NVML_VALUE_TYPE_") for n in dir(pynvml)
              if n.startswith("NVML_VALUE_TYPE_") and n != "NVML_VALUE_TYPE_COUNT"}


COPY_BYTES = 256 * 2**20
"""Bytes of each copy, each way."""


def copy_loop(start: threading.Event, stop: threading.Event, copies: list[int]) -> None:
    """Host <-> cuda:0 copies of COPY_BYTES between ``start`` and ``stop``; counts them."""
    host = torch.empty(COPY_BYTES // 4, dtype=torch.float32).pin_memory()
    dev = torch.empty_like(host, device="cuda:0")
    torch.cuda.synchronize()
    start.wait()
    while not stop.is_set():
        dev.copy_(host, non_blocking=True)
        host.copy_(dev, non_blocking=True)
        torch.cuda.synchronize()
        copies[0] += 1


def main() -> None:
    """Print each field value's type per device, then sample under the copy loop."""
    pynvml.nvmlInit()
    print(f"driver {pynvml.nvmlSystemGetDriverVersion()}, "
          f"nvidia-ml-py {importlib.metadata.version('nvidia-ml-py')}")
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        ids = [(getattr(pynvml, f), 0) for f in FIELDS]
        answers = pynvml.nvmlDeviceGetFieldValues(h, ids)
        print(f"device {i} {pynvml.nvmlDeviceGetName(h)}")
        for name, v in zip(FIELDS, answers, strict=True):
            kind = TYPE_NAMES.get(v.valueType, v.valueType) if v.nvmlReturn == 0 else (
                f"error {pynvml.NVMLError(v.nvmlReturn)}")
            print(f"  {name:40s} {kind}")
    pynvml.nvmlShutdown()

    start, stop, copies = threading.Event(), threading.Event(), [0]
    worker = threading.Thread(target=copy_loop, args=(start, stop, copies))
    worker.start()
    source = NvmlSource(node=0)
    rows = []
    try:
        rows += sample_once(source, time.time())
        start.set()
        t_copy = time.time()
        while time.time() < t_copy + 3.0:
            time.sleep(0.02)
            rows += sample_once(source, time.time())
        stop.set()
        worker.join()
        t_copy = time.time() - t_copy
        for _ in range(8):
            time.sleep(0.02)
            rows += sample_once(source, time.time())
        fields = source.fields()
    finally:
        stop.set()
        source.close()
    copied = copies[0] * COPY_BYTES
    print(f"copy loop: {copies[0]} x 256 MiB each way in {t_copy:.2f} s "
          f"({copied / t_copy / 1e9:.1f} GB/s each way)")
    for name in ("pcie_tx_bytes", "pcie_rx_bytes", "link_tx_bytes"):
        got = [r[name] for r in rows if r["device"] == 0 and r[name] is not None]
        monotone = all(b >= a for a, b in zip(got, got[1:], strict=False))
        ratio = f", advance / bytes copied {(got[-1] - got[0]) / copied:.4f}" if got else ""
        print(f"{name}: {len(got)} reads, first {got[:1]}, last {got[-1:]}, "
              f"never decreasing: {monotone}{ratio}; reason: {fields[name].reason}")


if __name__ == "__main__":
    main()
