"""Predicted against measured: step time and mean power per point, with the error and why.

    python3 benchmarks/projection/validate.py PRED_DIR MEASURED_DIR [--out DIR] [--tag h100x4]

PRED_DIR holds projection files (predict.py), MEASURED_DIR bundles at any depth (only their
manifest.json, metrics.json and profile/*.breakdown.json are read, so the small files of a
bundle are enough). A prediction and a measurement are the same point when workload, layout,
data parallelism and batch match (points.point_key). Prints the table and writes
``validation-<tag>.{txt,json}`` into DIR (default: the current folder): ``{"device", "date",
"points": [{name, predicted_step_s, measured_step_s, predicted_power_w, measured_power_w,
step_error, power_error, ...}], "summary": {...}}``. Where the measured point has a profile,
each point also gets the split of its step into compute, exposed communication and idle,
predicted and measured, and a miss (error beyond 10%) names the part that differs most.
"""

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from points import point_key, point_name  # noqa: E402
from tabulate import tabulate  # noqa: E402

from kit.bundle.reader import Bundle, read_bundle  # noqa: E402
from kit.metrics.kernels import read_breakdowns  # noqa: E402
from kit.projection.file import SUFFIX, ProjectionFile, read_projection  # noqa: E402
from kit.projection.sources import device_power  # noqa: E402

TOLERANCE = 0.10
"""Issue 29's bar: within 10% of the measured step time and mean power (issue 37 asks 15% of
the step across GPU kinds: the table shows the errors, the JSON both counts)."""
CROSS_KIND = 0.15
PARTS = ("compute", "communication", "idle")


def measured_bundles(folder: Path) -> list[Bundle]:
    """The training bundles under ``folder`` (fabric bundles left out)."""
    out = []
    for manifest in sorted(folder.rglob("manifest.json")):
        bundle = read_bundle(manifest.parent)
        if bundle.manifest.workload.get("family") != "fabric":
            out.append(bundle)
    return out


def predicted_split(p: ProjectionFile) -> dict[str, float]:
    """Seconds per step in compute, exposed communication and idle, mean over stages.

    An eager pipeline's wait for the device after each p2p call counts as communication (a
    profile shows it inside the p2p kernels).
    """
    m, step = p.step["micro_batches"], p.summary["step_time_s"]
    compute = [m * s.compute_s + s.optimizer_s for s in p.stages]
    comm = [m * (s.blocking_comm_s[1] + (s.p2p_sync_s[1] if s.p2p_sync_s else 0.0))
            + s.tail_s[1] - s.optimizer_s for s in p.stages]
    c, e = sum(compute) / len(compute), sum(comm) / len(comm)
    return {"compute": c, "communication": e, "idle": max(0.0, step - c - e)}


def measured_split(bundle: Bundle, step_s: float) -> dict[str, float] | None:
    """The measured profile's shares, mean over profiled ranks, times the measured step."""
    shares = []
    for rank in read_breakdowns(bundle):
        window = sum(s.window_s for s in rank.steps)
        if not window:
            continue
        by_kind = dict.fromkeys(PARTS, 0.0)
        for s in rank.steps:
            for c in s.categories:
                by_kind[c.kind] += c.time_s / window
        shares.append(by_kind)
    if not shares:
        return None
    return {k: step_s * sum(s[k] for s in shares) / len(shares) for k in PARTS}


def _error(predicted: float | None, measured: float | None) -> float | None:
    return None if predicted is None or not measured else predicted / measured - 1


def why(step_error: float | None, predicted: dict[str, float],
        measured: dict[str, float] | None) -> str:
    """The part of the step that differs most, for a miss."""
    if step_error is None or abs(step_error) <= TOLERANCE:
        return ""
    if measured is None:
        return "no measured profile to tell which part differs"
    part = max(PARTS, key=lambda k: abs(predicted[k] - measured[k]))
    return (f"{part}: predicted {predicted[part]:.3f} s, measured {measured[part]:.3f} s per "
            "step")


def point(pred: ProjectionFile, bundle: Bundle) -> dict[str, Any]:
    """One row of the validation."""
    step = bundle.metrics.summary["step_time_s"]
    power = device_power(bundle)[0]  # its GPUs only: the sampler reads every GPU of the host
    p_step, p_power = pred.summary["step_time_s"], pred.summary["power_w_mean"]
    split_p = predicted_split(pred)
    split_m = measured_split(bundle, step) if step else None
    step_error = _error(p_step, step)
    low, _, high = pred.interval["step_time_s"]
    return {
        "name": point_name(pred.config), "world_size": pred.summary["world_size"],
        "predicted_step_s": p_step, "measured_step_s": step, "step_error": step_error,
        "predicted_step_interval_s": [low, high],
        "measured_in_interval": step is not None and low <= step <= high,
        "predicted_power_w": p_power, "measured_power_w": power,
        "power_error": _error(p_power, power),
        "predicted_split_s": split_p, "measured_split_s": split_m,
        "why": why(step_error, split_p, split_m),
        "source": next(i.bundle for i in pred.inputs if i.role == "compute"),
        "source_kind": pred.source_kind,
        "inputs_from": pred.provenance,
        "measured_bundle": bundle.path.name,
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f}%"


def _num(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def table(points: list[dict[str, Any]]) -> str:
    rows = [(p["name"], p["source_kind"] or "?", p["world_size"],
             _num(p["predicted_step_s"], ".4f"),
             f"{p['predicted_step_interval_s'][0]:.3f}..{p['predicted_step_interval_s'][1]:.3f}",
             _num(p["measured_step_s"], ".4f"), _pct(p["step_error"]),
             _num(p["predicted_power_w"], ".0f"), _num(p["measured_power_w"], ".0f"),
             _pct(p["power_error"]), p["why"]) for p in points]
    return tabulate(rows, headers=("point", "from", "GPUs", "pred step s", "interval s",
                                   "meas step s", "error", "pred W", "meas W", "error",
                                   "miss: why"),
                    disable_numparse=True)


def _within(points: list[dict[str, Any]], key: str, tolerance: float = TOLERANCE) -> str:
    known = [p[key] for p in points if p[key] is not None]
    return f"{sum(abs(e) <= tolerance for e in known)}/{len(known)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pred_dir", type=Path)
    ap.add_argument("measured_dir", type=Path)
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--tag", help="<gpu>x<N> in the file names (default: from the bundles; a "
                    "cross-kind validation adds -from-<kind>)")
    args = ap.parse_args()
    preds = {point_key(p.config): p for p in map(read_projection,
                                                 sorted(args.pred_dir.glob(f"*{SUFFIX}")))}
    measured = measured_bundles(args.measured_dir)
    points, unmatched = [], []
    for b in measured:
        pred = preds.pop(point_key(b.manifest.config), None)
        if pred is None:
            unmatched.append(f"measured {b.path.name} ({point_name(b.manifest.config)}): no "
                             "prediction")
        else:
            points.append(point(pred, b))
    unmatched += [f"predicted {point_name(p.config)}: not measured" for p in preds.values()]
    if not points:
        print("no point has both a prediction and a measurement", file=sys.stderr)
        for line in unmatched:
            print(line, file=sys.stderr)
        return 1
    points.sort(key=lambda p: (p["world_size"], p["name"]))
    first = measured[0].manifest
    tag = args.tag or f"{first.platform['name']}x{max(p['world_size'] for p in points)}"
    device = (first.inventory[0].gpus[0].get("name") if first.inventory
              and first.inventory[0].gpus else first.platform.get("device_name"))
    summary = {"step_within_10pct": _within(points, "step_error"),
               "power_within_10pct": _within(points, "power_error"),
               "step_within_15pct": _within(points, "step_error", CROSS_KIND),
               "measured_in_interval": f"{sum(p['measured_in_interval'] for p in points)}/"
                                       f"{len(points)}",
               "source_kinds": sorted({p["source_kind"] or "?" for p in points}),
               "unmatched": unmatched}
    text = "\n".join([
        f"# projection vs measurement, {tag} ({device}); "
        f"{datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}",
        f"# predictions: {args.pred_dir}  measurements: {args.measured_dir}",
        table(points), "",
        f"step time within 10%: {summary['step_within_10pct']} (15%: "
        f"{summary['step_within_15pct']}); mean power within 10%: "
        f"{summary['power_within_10pct']}; measured step inside the projected interval: "
        f"{summary['measured_in_interval']}", *unmatched])
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"validation-{tag}.txt").write_text(text + "\n")
    (args.out / f"validation-{tag}.json").write_text(json.dumps(
        {"device": device, "date": f"{datetime.now(timezone.utc):%Y-%m-%d}",
         "points": points, "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
