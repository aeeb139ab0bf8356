"""NVML probe: what NvmlSource reads on this GPU machine, and how often each counter changes.

    python3 benchmarks/telemetry/nvml_probe.py

Builds ``NvmlSource(node=0)`` and prints its fields and devices. Then, while a background
thread keeps cuda:0 busy with bf16 matmuls, samples every 10 ms for about 3 s and prints per
device: min/mean/max of each non-null field and the median interval between changes of its
value (the counter's real update period, since sampling is faster), ``power_w`` integrated over
time against the energy counter's delta, and the throttle reasons seen; last, what reading every
field once cost (``sample_once``: the fast fields and, one after another, the slow counters the
sampler reads on threads of their own). Run from the repository root with the kit importable.
"""

import statistics
import threading
import time
from typing import Any

import pynvml
import torch

from kit.bundle.telemetry_fields import CANONICAL_FIELDS
from kit.telemetry.base import sample_once
from kit.telemetry.nvidia.nvml import NvmlSource
from kit.telemetry.throttle import reason_names

INTERVAL_S = 0.010
"""Sampling period: well under NVML's ~100 ms power update, so changes show its real period."""

DURATION_S = 3.0
"""How long to sample under load."""

TABLE_DEVICES = 2
"""Devices that get a full table; the others one summary line each (keeps output short)."""


def load(stop: threading.Event, errors: list[BaseException]) -> None:
    """Run 8192^3 bf16 matmuls on cuda:0 until ``stop`` is set."""
    try:
        a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
        b, c = torch.randn_like(a), torch.empty_like(a)
        while not stop.is_set():
            for _ in range(20):
                torch.matmul(a, b, out=c)
            torch.cuda.synchronize()  # bounds the queue and releases the GIL to the sampler
    except BaseException as e:  # noqa: BLE001 - reported by the main thread
        errors.append(e)


def change_period_ms(series: list[tuple[float, Any]]) -> float | None:
    """Median time between samples whose value differs from the previous one, in ms."""
    changes = [t for (t, v), (_, prev) in zip(series[1:], series, strict=False) if v != prev]
    gaps = [b - a for a, b in zip(changes, changes[1:], strict=False)]
    return statistics.median(gaps) * 1e3 if gaps else None


def energy_line(rows: list[dict[str, Any]]) -> str:
    """power_w integrated over the samples (trapezoid) vs the energy counter's delta."""
    pts = [(r["t"], r["power_w"], r["energy_j"]) for r in rows]
    pts = [p for p in pts if p[1] is not None and p[2] is not None]
    if len(pts) < 2:
        return "energy check: power_w or energy_j not readable"
    pairs = zip(pts, pts[1:], strict=False)
    integral_j = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0, _), (t1, p1, _) in pairs)
    counter_j = pts[-1][2] - pts[0][2]
    diff = f"{100 * (integral_j - counter_j) / counter_j:+.2f}%" if counter_j else "n/a"
    return (
        f"energy over {pts[-1][0] - pts[0][0]:.2f} s: integrated power_w {integral_j:.1f} J, "
        f"counter delta {counter_j:.1f} J, difference {diff}"
    )


def throttle_line(rows: list[dict[str, Any]]) -> str:
    """Share of samples with each decoded throttle reason."""
    masks = [r["throttle"] for r in rows if r["throttle"] is not None]
    if not masks:
        return "throttle: not readable"
    seen: dict[str, int] = {}
    for mask in masks:
        for name in reason_names(mask):
            seen[name] = seen.get(name, 0) + 1
    shares = ", ".join(f"{k} {v / len(masks):.0%}" for k, v in seen.items()) or "none"
    return f"throttle reasons (share of samples): {shares}"


def table(rows: list[dict[str, Any]]) -> None:
    """Print min/mean/max and change period of every non-null field."""
    print(f"  {'field':15s} {'min':>12s} {'mean':>12s} {'max':>12s} {'changes every':>14s}")
    for name in CANONICAL_FIELDS:
        series = [(r["t"], r[name]) for r in rows if r[name] is not None]
        if not series:
            continue
        vals = [v for _, v in series]
        period = change_period_ms(series)
        every = f"{period:.1f} ms" if period is not None else "constant"
        print(f"  {name:15s} {min(vals):12.6g} {statistics.fmean(vals):12.6g} "
              f"{max(vals):12.6g} {every:>14s}")


def main() -> None:
    """Probe, sample under load, and print the summary."""
    source = NvmlSource(node=0)
    try:
        print(f"driver {pynvml.nvmlSystemGetDriverVersion()}, torch {torch.__version__}")
        print("fields (readable, update period, reason or note):")
        for name, info in source.fields().items():
            period = f"{info.update_period_ms:g} ms" if info.update_period_ms else "-"
            print(f"  {name:15s} {'yes' if info.readable else 'NO':3s} {period:>7s} "
                  f"{(info.reason or '')[:72]}")
        # NVML and CUDA may number devices differently: find cuda:0 by UUID.
        cuda0_uuid = str(torch.cuda.get_device_properties(0).uuid)
        loaded = [d["device"] for d in source.devices() if cuda0_uuid in d.get("uuid", "")]
        for dev in source.devices():
            print("device", dev)
        stop, errors = threading.Event(), []
        worker = threading.Thread(target=load, args=(stop, errors), daemon=True)
        worker.start()
        time.sleep(0.5)  # let the clocks ramp up
        rows: list[dict[str, Any]] = []
        costs_ms: list[float] = []
        start = time.monotonic()
        tick = start
        while tick < start + DURATION_S:
            time.sleep(max(0.0, tick - time.monotonic()))
            t0 = time.perf_counter()
            rows.extend(sample_once(source, time.time()))
            costs_ms.append((time.perf_counter() - t0) * 1e3)
            tick += INTERVAL_S
        elapsed_s = time.monotonic() - start
        stop.set()
        worker.join()
    finally:
        source.close()
    if errors:
        print(f"WARNING: the load thread failed, values are idle ones: {errors[0]!r}")
    print(f"{len(costs_ms)} ticks in {elapsed_s:.2f} s (asked every {INTERVAL_S * 1e3:g} ms); "
          f"a read of every field (sample_once: fast and slow) took median "
          f"{statistics.median(costs_ms):.2f} ms, "
          f"max {max(costs_ms):.2f} ms for {len(rows) // len(costs_ms)} device(s)")
    for i, dev in enumerate(sorted({r["device"] for r in rows})):
        dev_rows = [r for r in rows if r["device"] == dev]
        print(f"device {dev}{' (cuda:0, loaded)' if dev in loaded else ''}:")
        if i < TABLE_DEVICES:
            table(dev_rows)
        print(" ", energy_line(dev_rows))
        print(" ", throttle_line(dev_rows))


if __name__ == "__main__":
    main()
