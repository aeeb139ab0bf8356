"""What the kit's telemetry sampler costs, piece by piece, on a busy GPU (issue 33).

    python3 benchmarks/telemetry/sampler_cost_gpu.py [--seconds 8] [--devices 0,0,0,0]

Keeps GPU 0 busy with bf16 matrix products in a child process (as training would), then runs
the real :class:`~kit.telemetry.sampler.TelemetrySampler` at 20 ms for ``--seconds`` under each
configuration below and prints, per configuration: the sampler process's CPU (cores used =
CPU seconds / wall seconds, from its own report), ticks and missed ticks, and the period
between fast rows (median, p90, p99). ``--devices 0,0,0,0`` opens GPU 0 four times, so one GPU
shows what four devices' slow lanes and fast reads cost the process (NVML's own calls are
per device; the kit's work scales with the count). With py-spy installed (carried as a wheel)
the last configuration is sampled by ``py-spy record --threads --nonblocking`` and the
heaviest frames are printed, so the CPU is attributed to code, not guessed.

Writes ``$OUT/sampler-cost-<gpu>.json`` and ``$OUT/sampler-cost-<gpu>.txt``.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from kit.bundle.writer import concat_chunks
from kit.telemetry.sampler import TelemetrySampler

LOAD = """
import time, torch
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
end = time.time() + float(__import__('sys').argv[1])
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
"""

LOG: list[str] = []


def say(line: str = "") -> None:
    """Print and keep for the text file."""
    print(line, flush=True)
    LOG.append(line)


def _hammer(call: Any, handles: list, stop: float, count: list[int], i: int) -> None:
    """Call ``call`` on each of ``handles`` in turn until ``stop``, counting in ``count[i]``."""
    while time.monotonic() < stop:
        for h in handles:
            call(h)
            count[i] += 1


def contention(devices: list[int], seconds: float) -> list[str]:
    """CPU per NVML call, each call kind read for ``seconds`` by one thread going over every
    device in turn, then by one thread per device at once: whether concurrent calls on
    different GPUs cost more CPU than the same calls in sequence."""
    import resource
    import threading

    import pynvml

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in devices]
    fields = {"pcie": [(pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0)],
              "nvlink": [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link)
                         for link in range(6)],
              "power instant": [(pynvml.NVML_FI_DEV_POWER_INSTANT, 0)]}
    calls = {"energy": pynvml.nvmlDeviceGetTotalEnergyConsumption,
             "violation": lambda h: pynvml.nvmlDeviceGetViolationStatus(
                 h, pynvml.NVML_PERF_POLICY_POWER),
             "memory info": pynvml.nvmlDeviceGetMemoryInfo,
             **{k: (lambda ids: lambda h: pynvml.nvmlDeviceGetFieldValues(h, ids))(v)
                for k, v in fields.items()}}
    lines = []
    for name, call in calls.items():
        for mode in ("sequential", "one thread per device"):
            count = [0] * len(handles)
            stop = time.monotonic() + seconds
            cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            if mode == "sequential":
                _hammer(call, handles, stop, count, 0)
            else:
                threads = [threading.Thread(target=_hammer, args=(call, [h], stop, count, i))
                           for i, h in enumerate(handles)]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join()
            cpu1, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - t0
            cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
            sys_cpu = cpu1.ru_stime - cpu0.ru_stime
            n = sum(count)
            per, per_sys = 1e3 * cpu / max(n, 1), 1e3 * sys_cpu / max(n, 1)
            lines.append(f"{name:14s} {mode:22s} {n / wall:8.0f} calls/s  {per:7.3f} ms "
                         f"CPU/call ({per_sys:.3f} system)  {cpu / wall:5.2f} cores")
    pynvml.nvmlShutdown()
    return lines


def configs(devices: list[int]) -> list[tuple[str, list[tuple[str, dict]]]]:
    """(name, sources) per configuration, cheapest first."""
    one = devices[:1]
    return [
        ("host only", [("host", {"node": 0})]),
        ("nvml 1 device, no nvlink", [("nvml", {"node": 0, "devices": one, "nvlink": False})]),
        ("nvml 1 device", [("nvml", {"node": 0, "devices": one})]),
        (f"nvml {len(devices)} devices, no nvlink",
         [("nvml", {"node": 0, "devices": devices, "nvlink": False})]),
        (f"nvml {len(devices)} devices", [("nvml", {"node": 0, "devices": devices})]),
        (f"nvml {len(devices)} devices + host",
         [("nvml", {"node": 0, "devices": devices}), ("host", {"node": 0})]),
    ]


def periods_ms(chunks: Path) -> dict[str, float | None]:
    """Median, p90, p99 of the spacing of fast rows (power_w, else cpu_util_pct) of device 0."""
    table = concat_chunks(chunks)
    for field, source in (("power_w", "gpu"), ("cpu_util_pct", "host")):
        rows = table.filter(pc.and_(pc.equal(table["source"], source),
                                    pc.is_valid(table[field])))
        if rows.num_rows > 2:
            t = np.unique(rows["t"].to_numpy())
            d = np.diff(t) * 1e3
            if not len(d):
                break
            return {"median": float(np.median(d)), "p90": float(np.percentile(d, 90)),
                    "p99": float(np.percentile(d, 99)), "n": int(len(d))}
    return {"median": None, "p90": None, "p99": None, "n": 0}


def profile(pid: int, seconds: float, out: Path) -> list[str]:
    """py-spy's heaviest frames of process ``pid`` (empty without py-spy)."""
    spy = shutil.which("py-spy") or str(Path(sys.prefix) / "bin" / "py-spy")
    site = os.environ.get("PYTHONPATH", "").split(":")[0]
    if not Path(spy).exists() and site:
        spy = str(Path(site) / "bin" / "py-spy")
    if not Path(spy).exists():
        return ["py-spy not found"]
    raw = out / "pyspy.txt"
    r = subprocess.run([spy, "record", "--pid", str(pid), "--duration", str(int(seconds)),
                        "--rate", "200", "--threads", "--nonblocking", "--native",
                        "--format", "raw", "--output", str(raw)], capture_output=True, text=True)
    if r.returncode != 0 or not raw.exists():
        return [f"py-spy failed: {(r.stderr or r.stdout).strip()[-300:]}"]
    leaf: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        frames = stack.split(";")
        key = ";".join(frames[-3:])
        leaf[key] = leaf.get(key, 0) + n
    top = sorted(leaf.items(), key=lambda kv: -kv[1])[:25]
    return [f"{100 * n / total:5.1f}%  {k}" for k, n in top]


def main() -> int:
    """Run every configuration and print the table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--devices", default="0,0,0,0")
    ap.add_argument("--contention", type=float, default=0.0,
                    help="seconds per call kind and mode of the NVML contention test (0: none)")
    args = ap.parse_args()
    devices = ([int(d) for d in args.devices.split(",")] if args.devices != "all"
               else list(range(len(subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                                                  text=True).stdout.splitlines()))))
    out = Path(os.environ.get("OUT", "results/sampler-cost"))
    out.mkdir(parents=True, exist_ok=True)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.splitlines()[0]
    tag = "h200" if "H200" in gpu else "h100" if "H100" in gpu else "gpu"
    say(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {gpu}; "
        f"python3 benchmarks/telemetry/sampler_cost_gpu.py --seconds {args.seconds:g} "
        f"--devices {args.devices}")
    cfgs = configs(devices)
    busy = args.seconds * (len(cfgs) + 2) + 30 + 12 * args.contention * 2
    loads = [subprocess.Popen([sys.executable, "-c", LOAD, str(busy)],
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": str(d)})
             for d in sorted(set(devices))]
    time.sleep(5)
    results = []
    try:
        if args.contention:
            say("NVML calls on busy GPUs, CPU per call (one thread over all devices, then one "
                "thread per device at once):")
            for line in contention(sorted(set(devices)), args.contention):
                say("  " + line)
        for i, (name, sources) in enumerate(cfgs):
            chunks = Path(tempfile.mkdtemp(prefix="cost-"))
            sampler = TelemetrySampler(sources, interval_ms=20, chunks_dir=chunks, flush_s=0.5)
            sampler.start()
            hot: list[str] = []
            if i == len(cfgs) - 1:
                hot = profile(sampler.pid or 0, args.seconds, out)
            else:
                time.sleep(args.seconds)
            report = sampler.stop()
            period = periods_ms(chunks)
            cores = report.cpu_s / report.wall_s if report.cpu_s and report.wall_s else None
            attempted = report.ticks + report.missed_ticks
            results.append({"config": name, "cpu_s": report.cpu_s, "wall_s": report.wall_s,
                            "cpu_cores": cores, "ticks": report.ticks,
                            "missed_ticks": report.missed_ticks,
                            "missed_tick_frac": report.missed_ticks / attempted
                            if attempted else None,
                            "period_ms": period, "errors": [e.message for e in report.errors]})
            say(f"{name:32s} cores {cores:.3f}  ticks {report.ticks} missed "
                f"{report.missed_ticks}  period ms median {period['median']} p90 "
                f"{period['p90']} p99 {period['p99']}")
            if hot:
                say("py-spy, heaviest frames (last three of each stack):")
                for line in hot:
                    say("  " + line)
            shutil.rmtree(chunks, ignore_errors=True)
    finally:
        for load in loads:
            load.kill()
    (out / f"sampler-cost-{tag}.json").write_text(json.dumps(
        {"device": gpu, "seconds": args.seconds, "devices": devices, "results": results},
        indent=1))
    (out / f"sampler-cost-{tag}.txt").write_text("\n".join(LOG) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
