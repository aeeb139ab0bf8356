"""Find which NVML read crashes (SIGSEGV) on a multi-GPU node under NCCL load.

    python3 benchmarks/telemetry/nvml_crash_hunt.py

Runs each group of NVML reads in its own process, 200 times at 20 ms on every GPU, and prints
whether the process survived and how long one round took.
"""

import subprocess
import sys

GROUPS = {
    "power_fields": "[(nv.NVML_FI_DEV_POWER_INSTANT, 0), (nv.NVML_FI_DEV_POWER_AVERAGE, 0)]",
    "memtemp_field": "[(nv.NVML_FI_DEV_MEMORY_TEMP, 0)]",
    "pcie_fields": "[(nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0), "
                   "(nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0)]",
    "nvlink_fields": "[(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, l) for l in range(18)]",
    "energy": "nv.nvmlDeviceGetTotalEnergyConsumption",
    "clocks": "lambda h: (nv.nvmlDeviceGetClockInfo(h, 1), nv.nvmlDeviceGetClockInfo(h, 2))",
    "util_mem": "lambda h: (nv.nvmlDeviceGetUtilizationRates(h), nv.nvmlDeviceGetMemoryInfo(h))",
    "throttle": "nv.nvmlDeviceGetCurrentClocksEventReasons",
    "violation": "lambda h: nv.nvmlDeviceGetViolationStatus(h, nv.NVML_PERF_POLICY_POWER)",
    "temp": "lambda h: nv.nvmlDeviceGetTemperature(h, 0)",
}

CHILD = """
import faulthandler, time, pynvml as nv
faulthandler.enable()
nv.nvmlInit()
hs = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
expr = {expr}
t0 = time.time()
for _ in range(200):
    for h in hs:
        if isinstance(expr, list):
            nv.nvmlDeviceGetFieldValues(h, expr)
        else:
            expr(h)
    time.sleep(0.02)
print(f"{{(time.time() - t0) / 200 * 1e3 - 20:.2f}} ms per round")
"""


def main() -> None:
    for name, expr in GROUPS.items():
        r = subprocess.run([sys.executable, "-c", CHILD.format(expr=expr)], capture_output=True,
                           text=True)
        tail = (r.stdout.strip() or r.stderr.strip().splitlines()[-1:] or [""])
        print(f"{name:14s} exit {r.returncode:4d}  {tail if isinstance(tail, str) else tail[0]}")


if __name__ == "__main__":
    main()
