"""Where a mixture-of-experts step's time goes, for each bundle of ``breakdown_1gpu.sh``.

    python benchmarks/moe/breakdown.py BUNDLE... --json OUT.json [--device LABEL]

For each bundle (a ``run --profile`` of one configuration): its step time and MFU (unprofiled
measured steps, ``metrics.json``), and the profiled step's device time by MoE category
(:mod:`kit.metrics.moe_breakdown`: expert GEMMs, permute/unpermute, router, all-to-all, dense
GEMMs, optimizer, host gaps ...). Writes one JSON in the form of
``benchmarks/parallel/results/h100x4-layouts.json`` (``device``, ``date``, ``points``), each point
also carrying ``variant`` (the bundle folder's parent name), ``breakdown_window_s`` and
``breakdown_s`` (category -> seconds of the profiled step). ``--top N`` also prints the N
device kernels with the most time per profiled step (the trace's kernels over its profiled
steps), with their calls and mean duration: which GEMM shapes and which elementwise kernels
to attack.
"""

import argparse
import datetime as dt
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))

from summarize import point  # noqa: E402  (benchmarks/parallel/summarize.py)

from kit.metrics.moe_breakdown import format_breakdown, step_breakdowns  # noqa: E402


def describe(bundle: Path, top: int = 0) -> dict:
    """The bundle's summary point plus its MoE breakdown (first profiled step of rank 0);
    with ``top``, also print that trace's ``top`` heaviest kernels."""
    p = {"variant": bundle.parent.name, **point(bundle)}
    traces = sorted((bundle / "profile").glob("rank*.json"))
    traces = [t for t in traces if not t.name.endswith(".breakdown.json")]
    steps = step_breakdowns(traces[0]) if traces else []
    p["breakdown_window_s"] = steps[0]["window_s"] if steps else None
    p["breakdown_s"] = ({k: round(v, 6) for k, v in steps[0]["categories"].items()}
                        if steps else None)
    p["breakdown_calls"] = steps[0]["calls"] if steps else None
    print(f"== {p['variant']}: {p['name']}  status {p['status']}")
    if p["step_s"]:
        mfu = f"{p['mfu']:.1%}" if p["mfu"] is not None else "n/a"
        print(f"step {p['step_s'] * 1e3:.1f} ms  MFU {mfu}  peak {p['mem_peak_gib'] or 0:.1f} GiB")
    if steps:
        print(format_breakdown(steps[0], p["step_s"]))
    else:
        print("no profiled step in this bundle")
    if top and traces:
        print(top_kernels(traces[0], top))
    return p


def top_kernels(trace: Path, n: int) -> str:
    """The ``n`` device kernels with the most time per profiled step of ``trace``."""
    events = json.loads(trace.read_text()).get("traceEvents", [])
    steps = sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") == "kernel" and isinstance(e.get("dur"), int | float):
            total[e["name"]] += e["dur"]
            calls[e["name"]] += 1
    per = max(steps, 1)
    lines = [f"top {n} kernels, per profiled step ({per}):"]
    for name, us in sorted(total.items(), key=lambda kv: -kv[1])[:n]:
        lines.append(f"  {us / per / 1e3:9.2f} ms {calls[name] / per:7.0f} calls "
                     f"{us / calls[name]:9.1f} us/call  {name[:110]}")
    return "\n".join(lines)


def main() -> None:
    """Describe every bundle, print, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundles", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--device", default=None, help="device label (default: from the bundles)")
    ap.add_argument("--top", type=int, default=0, help="also print each bundle's N top kernels")
    args = ap.parse_args()
    points = [describe(b, args.top) for b in args.bundles]
    device = args.device
    if device is None and args.bundles:
        from kit.bundle.reader import read_bundle

        gpus = read_bundle(args.bundles[0]).manifest.inventory[0].gpus
        device = f"{gpus[0].get('name', 'unknown')} x{len(gpus)}" if gpus else "cpu"
    out = {"device": device, "date": dt.date.today().isoformat(), "points": points}
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
