"""Summarize the fast-path runs of ``fastpath_gpu.sh``: one entry per bundle, and the ratios
of each recomputing step to the graphed step without recomputation of the same workload and
micro-batch (issue 56's bounds: full <= 1.40x, selective <= 1.08x, both graphed).

Usage: python3 benchmarks/fastpath/summarize.py RESULTS_DIR GPU_TAG COMMIT OUT_JSON
"""

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
from tabulate import tabulate

from kit.engines.execution import execution_of

BOUNDS = {"full": 1.40, "selective": 1.08}
"""Issue 56's bounds on a recomputing step over the graphed step without recomputation."""


def entry(run_dir: Path, device: str, commit: str) -> dict | None:
    """The issue's fields for the bundle under ``run_dir`` (None when the run left none)."""
    bundles = sorted(p.parent for p in run_dir.glob("*/manifest.json"))
    if not bundles:
        return None
    bundle = bundles[-1]
    manifest = json.loads((bundle / "manifest.json").read_text())
    metrics = json.loads((bundle / "metrics.json").read_text())
    cfg, summary, power = manifest["config"], metrics["summary"], metrics.get("power") or {}
    execution = execution_of(metrics.get("execution"), metrics.get("notes", []))
    steps = pq.read_table(bundle / "steps.parquet").to_pylist()
    losses = [r["loss"] for r in sorted(steps, key=lambda r: r["step"])
              if r["rank"] == 0 and r["loss"] is not None]
    workload = cfg["workload"]
    return {
        "run": run_dir.name, "workload": workload["name"],
        "micro_batch": cfg["micro_batch_size"], "global_batch": cfg["global_batch_size"],
        "recompute": cfg["optim"]["recompute"], "moe": bool(workload.get("num_experts")),
        "moe_capacity": workload.get("moe_capacity_factor"),
        "graphed": None if execution is None else execution.graphed,
        "eager_because": None if execution is None else list(execution.eager_because),
        "step_time_s": summary["step_time_s"], "mfu": summary["mfu"],
        "util_gpu_pct_mean": power.get("util_gpu_pct_mean"),
        "power_w_mean": summary["power_w_mean"], "peak_to_mean": power.get("peak_to_mean"),
        "status": manifest["status"], "error": manifest["error"],
        "device": device, "commit": commit, "losses": losses,
    }


def ratios(entries: list[dict]) -> list[dict]:
    """Each recomputing run's step over the graphed no-recompute run of its workload and
    micro-batch, with the issue's bound and whether it holds."""
    base = {(e["workload"], e["micro_batch"]): e for e in entries
            if e["recompute"] == "none" and e["graphed"] and e["step_time_s"]}
    out = []
    for e in entries:
        ref = base.get((e["workload"], e["micro_batch"]))
        if e["recompute"] == "none" or ref is None or not e["step_time_s"]:
            continue
        ratio = e["step_time_s"] / ref["step_time_s"]
        bound = BOUNDS[e["recompute"]]
        out.append({"run": e["run"], "over": ref["run"], "ratio": round(ratio, 3),
                    "graphed": e["graphed"], "bound": bound,
                    "holds": bool(e["graphed"] and ratio <= bound)})
    return out


def main() -> None:
    results, tag, commit, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
    entries = [e for d in sorted(results.iterdir()) if d.is_dir() and d.name != "out"
               for e in [entry(d, tag, commit)] if e is not None]
    table = ratios(entries)
    out.write_text(json.dumps({"runs": entries, "ratios": table}, indent=1))
    print(tabulate([[e["run"], e["graphed"], e["step_time_s"], e["mfu"], e["util_gpu_pct_mean"],
                     e["power_w_mean"], e["peak_to_mean"], e["status"]] for e in entries],
                   headers=["run", "graphed", "step s", "MFU", "util %", "W mean", "peak/mean",
                            "status"], floatfmt=".3f"))
    print(tabulate([[r["run"], r["over"], r["ratio"], r["bound"], r["holds"]] for r in table],
                   headers=["run", "over", "ratio", "bound", "holds"]))


if __name__ == "__main__":
    main()
