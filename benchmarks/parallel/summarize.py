"""One JSON (and a table) of a folder of bundles: each point's layout, status, speed, idle share,
power and start-up/teardown time, in the form issue 24 asks for.

    python benchmarks/parallel/summarize.py results/node4-study-layouts --json h100x4-layouts.json
        [--refs refs.json]

``gpu_idle_frac`` is the idle share of the profiled step's window on the profiled rank (the kit's
own breakdown, ``profile/rank<N>.breakdown.json``); the profiler slows an eager step's host side,
so ``gpu_idle_frac_unprofiled`` puts the same step's GPU busy time against the unprofiled median
step instead (``1 - busy / step``). Both are null where the profiled window holds less than half
the step (the trace missed the step's kernels). ``--refs`` merges reference figures (plain
PyTorch DDP, tensor parallel) measured in the same call: a JSON object mapping a point name to
``{"ref_name": ..., "ref_step_s": ...}``; a point's name is its workload and layout, e.g.
``"gpt3-1.3b tp2 pp1 dp2 cp1 ep1 sp"``.
"""

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from tabulate import tabulate

from kit.bundle.reader import read_bundle


def layout(cfg: dict[str, Any]) -> str:
    """``"tp2 pp1 dp2 cp1 ep1 sp"`` plus the options that change the work or its speed."""
    p, o = cfg["parallel"], cfg["optim"]
    parts = [f"tp{p['tp']} pp{p['pp']} dp{p['dp']} cp{p['cp']} ep{p['ep']}"]
    if p.get("vpp"):
        parts.append(f"vpp{p['vpp']}")
    if p.get("sp"):
        parts.append("sp")
    for flag, name in (("dist_optimizer", "distopt"), ("overlap", "overlap"), ("fsdp", "fsdp")):
        if o.get(flag):
            parts.append(name)
    if cfg["engine"] == "deepspeed":
        parts.append(f"zero{o['zero']}")
    if cfg["engine"] == "fsdp2":
        parts.append("fsdp2")
    if o.get("recompute", "none") != "none":
        parts.append(f"recompute-{o['recompute']}")
    if cfg.get("speed") is not None:  # the run chose its speed features (--speed)
        parts.append(f"speed-{'+'.join(cfg['speed']) or 'none'}")
    return " ".join(parts)


def idle_fractions(bundle: Path, step_s: float | None) -> tuple[float | None, float | None]:
    """(idle share of the profiled window, 1 - GPU busy time / unprofiled step) of the first
    profiled rank's first profiled step; (None, None) without a profile."""
    files = sorted((bundle / "profile").glob("rank*.breakdown.json"))
    if not files:
        return None, None
    data = json.loads(files[0].read_text())
    if not data.get("steps"):
        return None, None
    step = data["steps"][0]
    idle = sum(c["time_s"] for c in step["categories"] if c["kind"] == "idle")
    window = step["window_s"]
    if window < 0.5 * step["wall_s"]:
        # the trace's step annotation missed the step's kernels (seen with the replayed CUDA
        # graph of tensor-parallel ranks): no idle share can be read from it
        return None, None
    busy = window - idle
    unprofiled = data.get("unprofiled_step_time_s") or step_s
    est = max(0.0, 1 - busy / unprofiled) if unprofiled else None
    return round(idle / window, 4), None if est is None else round(est, 4)


def point(bundle: Path) -> dict[str, Any]:
    """The summary of one bundle."""
    b = read_bundle(bundle)
    m, s = b.manifest, b.metrics.summary
    cfg = m.config
    idle, idle_est = idle_fractions(bundle, s.get("step_time_s"))
    life = b.metrics.lifecycle or {}
    return {
        "name": f"{cfg['workload']['name']} {layout(cfg)}",
        "bundle": bundle.name,
        "workload": cfg["workload"]["name"],
        "engine": cfg["engine"],
        "layout": layout(cfg),
        "micro_batch": cfg["micro_batch_size"],
        "global_batch": cfg["global_batch_size"],
        "status": m.status,
        "error": m.error,
        "step_s": s.get("step_time_s"),
        "mfu": s.get("mfu"),
        "tflops_per_gpu": s.get("tflops_per_gpu"),
        "gpu_idle_frac": idle,
        "gpu_idle_frac_unprofiled": idle_est,
        "power_w_mean": s.get("power_w_mean"),
        "power_w_peak": s.get("power_w_peak"),
        "mem_peak_gib": s.get("mem_peak_gib"),
        "launch_to_first_step_s": life.get("launch_to_first_step_s"),
        "launch_to_first_step_end_s": life.get("launch_to_first_step_end_s"),
        "last_step_to_assembly_s": life.get("last_step_to_assembly_s"),
        "phases_s": life.get("phases_s"),
        "notes": [n for n in b.metrics.notes if "speed features" in n or "cuda_graph" in n],
    }


def bundles_of(folder: Path) -> list[Path]:
    """Bundles under ``folder``: itself, its children, or a sweep's point folders."""
    found = [p.parent for p in folder.glob("**/manifest.json") if ".partial" not in str(p)]
    return sorted(found, key=lambda p: p.name)


def main() -> None:
    """Summarize, print a table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--refs", type=Path, help="reference figures to merge by point name")
    ap.add_argument("--device", default=None, help="device label (default: from the bundles)")
    args = ap.parse_args()
    points = [point(b) for f in args.folders for b in bundles_of(f)]
    refs = json.loads(args.refs.read_text()) if args.refs and args.refs.is_file() else {}
    for p in points:
        p.update(refs.get(p["name"], {}))
    device = args.device
    if device is None and points:
        first = read_bundle(bundles_of(args.folders[0])[0]).manifest
        gpus = first.inventory[0].gpus if first.inventory else []
        device = f"{gpus[0].get('name', '?')} x{len(gpus)}" if gpus else "cpu"
    doc = {"device": device, "date": dt.date.today().isoformat(), "points": points}
    args.json.write_text(json.dumps(doc, indent=1))
    rows = [[p["workload"], p["layout"], p["status"], p["step_s"] and round(p["step_s"], 4),
             p["mfu"] and f"{100 * p['mfu']:.1f}%", p["gpu_idle_frac"],
             p["gpu_idle_frac_unprofiled"], p["power_w_mean"] and round(p["power_w_mean"]),
             p["launch_to_first_step_end_s"], p["last_step_to_assembly_s"],
             p.get("ref_step_s") and round(p["step_s"] and p["ref_step_s"] / p["step_s"], 3)]
            for p in points]
    print(f"# {device}, {doc['date']}: {len(points)} bundles")
    print(tabulate(rows, headers=["workload", "layout", "status", "step s", "MFU", "idle",
                                  "idle (unprof.)", "W mean", "to 1st step s", "to bundle s",
                                  "ref/kit"]))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
