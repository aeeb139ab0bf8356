"""The period summary of issue 25 from files a GPU call brought back: a telemetry run's
``telemetry.parquet`` and ``RUNS.json``, the bundles of that call by id, each with ``tele``
(the interval asked, 0 = off), ``cp``, ``tokens_per_s`` and ``samplers`` (from its metrics.json).

    python benchmarks/telemetry/period_summary.py TELEMETRY.parquet RUNS.json \
        --asked-ms 20 --json period-h100x4.json

Used where the call could not run ``period_gpu.py`` whole (benchmarks/telemetry/README.md):
gaps are taken over the whole run (start-up and teardown included, where the sampler runs as
during the steps). Fast fields: instantaneous and averaged power, SM clock, GPU temperature,
utilisation; ``fast_period_ms_*`` is ``power_w`` on the worst device.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

FAST = ("power_w", "power_avg_w", "clock_sm_mhz", "temp_gpu_c", "util_gpu_pct", "throttle")


def gaps(path: Path) -> dict[str, dict[str, dict[str, float]]]:
    """Per device and field: median, p90, p99 and count of the gaps between rows holding it."""
    rows = pq.read_table(path).to_pandas()
    rows = rows[rows["device"].notna()]
    out: dict[str, dict[str, dict[str, float]]] = {}
    for device, group in rows.groupby("device"):
        for field in group.columns:
            if field in ("t", "node", "device", "source") or group[field].isna().all():
                continue
            t = np.sort(group.loc[group[field].notna(), "t"].to_numpy())
            d = np.diff(t) * 1e3
            if len(d) > 2:
                out.setdefault(f"gpu{int(device)}", {})[field] = {
                    "median": round(float(np.median(d)), 2),
                    "p90": round(float(np.percentile(d, 90)), 2),
                    "p99": round(float(np.percentile(d, 99)), 2), "n": int(len(d))}
    return out


def main() -> None:
    """Print the table and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("telemetry", type=Path)
    ap.add_argument("runs", type=Path)
    ap.add_argument("--asked-ms", type=float, default=20.0)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    per = gaps(args.telemetry)
    runs = [r for r in json.loads(args.runs.read_text()).values()
            if isinstance(r, dict) and r.get("cp") == 1]
    on = next(r for r in runs if r["tele"])
    off = next(r for r in runs if not r["tele"])
    for device, fields in per.items():
        print(f"{device}:  field              median      p90      p99   (ms)   rows")
        for field, p in fields.items():
            print(f"       {field:18s} {p['median']:7.2f}  {p['p90']:7.2f}  {p['p99']:7.2f}  "
                  f"{p['n']:7d}")
    power = [fields["power_w"] for fields in per.values() if "power_w" in fields]
    ratio = on["tokens_per_s"] / off["tokens_per_s"]
    doc = {
        "devices": len(per), "asked_ms": args.asked_ms,
        "fast_period_ms_median": max(p["median"] for p in power),
        "fast_period_ms_p99": max(p["p99"] for p in power),
        "throughput_ratio": round(ratio, 4),
        "tokens_per_s_on": on["tokens_per_s"],
        "tokens_per_s_off": off["tokens_per_s"],
        "samplers": on.get("samplers"),
        "fast_fields": {d: {f: v for f, v in fs.items() if f in FAST} for d, fs in per.items()},
        "slow_fields": {d: {f: v for f, v in fs.items() if f not in FAST} for d, fs in per.items()},
    }
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"fast period (power_w, worst device): median {doc['fast_period_ms_median']} ms, "
          f"p99 {doc['fast_period_ms_p99']} ms at {args.asked_ms:g} ms asked; throughput with "
          f"telemetry / without: {ratio:.4f}")


if __name__ == "__main__":
    main()
