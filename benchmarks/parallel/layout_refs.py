"""References for issue 35's layouts, taken from the same sweep: the ``--refs`` JSON of summarize.

Each layout is held against the one its goal names, measured in the same call on the same GPUs
(layouts_host_gpu.sh names the pairs: pipeline layouts against DP4, FSDP against DP4 with the
distributed optimizer, CP2 x TP2 + SP against TP4 + SP at the same sequence length, ZeRO-3
against ZeRO-1). A pair given with ``--loss-pair`` also gets the largest relative difference of
the per-step losses (the loss-reporting rank of each run, every step the bundles hold): the
CP goal's "loss equal to the CP1 run's".

    python benchmarks/parallel/layout_refs.py SUMMARY.json SWEEP_FOLDER --out refs.json \
        --pair "tp1 pp2 dp2 cp1 ep1" "tp1 pp1 dp4 cp1 ep1" \
        --loss-pair "tp2 pp1 dp1 cp2 ep1 sp" "tp4 pp1 dp1 cp1 ep1 sp" \
        --previous benchmarks/parallel/results/h200x4-layouts-host.json

``--previous`` (the JSON committed by an earlier call on the same GPU kind) holds each pair's
throughput against its reference now and then, and names a drop of more than
:data:`REGRESSION` a regression: a ratio measured in one call does not move with the host's
speed, so a layout that lost ground (PP2 x DP2 lost 28% between two commits of 2026-11-26/27
unnoticed) is caught by the next call.
"""

import argparse
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

REGRESSION = 0.10
"""A throughput ratio this much below the previous call's is named a regression."""


def _losses(bundle: Path) -> list[float]:
    """Per-step losses of the run's loss-reporting rank (the highest rank with losses)."""
    rows = [r for r in pq.read_table(bundle / "steps.parquet").to_pylist()
            if r["loss"] is not None]
    if not rows:
        return []
    rank = max(r["rank"] for r in rows)
    return [r["loss"] for r in sorted(rows, key=lambda r: r["step"]) if r["rank"] == rank]


def references(points: list[dict[str, Any]], sweep: Path, pairs: dict[str, str],
               loss_pairs: set[str]) -> dict[str, dict[str, Any]]:
    """``{point name: {"ref_name", "ref_step_s"[, "loss_max_rel_diff_vs_ref", ...]}}``.

    ``pairs`` maps a layout to its reference's layout (within the same workload);
    ``loss_pairs`` names the layouts whose losses are compared with the reference's.
    """
    by_layout = {(p["workload"], p["layout"]): p for p in points if p["status"] == "ok"}
    bundles = {b.parent.name: b.parent for b in sweep.glob("**/manifest.json")}
    refs: dict[str, dict[str, Any]] = {}
    for p in points:
        ref_layout = pairs.get(p["layout"])
        ref = by_layout.get((p["workload"], ref_layout)) if ref_layout else None
        if ref is not None and p["status"] == "ok":
            entry: dict[str, Any] = {"ref_name": f"kit {ref['workload']} {ref_layout}",
                                     "ref_step_s": ref["step_s"]}
            if p["layout"] in loss_pairs and p["bundle"] in bundles and ref["bundle"] in bundles:
                mine, theirs = (_losses(bundles[b]) for b in (p["bundle"], ref["bundle"]))
                if mine and len(mine) == len(theirs):
                    entry["loss_max_rel_diff_vs_ref"] = max(
                        abs(a - b) / abs(b) for a, b in zip(mine, theirs, strict=True))
                    entry["losses"], entry["ref_losses"] = mine, theirs
            refs[p["name"]] = entry
    return refs


def regressions(now: dict[str, float], previous: Path) -> list[str]:
    """Lines comparing each pair's throughput ratio with the one in ``previous``."""
    then = {p["name"]: p["ref_step_s"] / p["step_s"]
            for p in json.loads(previous.read_text())["points"]
            if p.get("ref_step_s") and p.get("step_s")}
    lines = []
    for name, ratio in now.items():
        if name in then:
            drop = 1 - ratio / then[name]
            verdict = "REGRESSION" if drop > REGRESSION else "ok"
            lines.append(f"{name}: {ratio:.3f}x now, {then[name]:.3f}x in {previous.name} "
                         f"({ratio / then[name] - 1:+.1%}): {verdict}")
    return lines


def main() -> None:
    """Write the references of every point of a summary that has one."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("summary", type=Path, help="summarize.py's JSON of the sweep")
    ap.add_argument("sweep", type=Path, help="the sweep folder (bundles, for the losses)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pair", nargs=2, action="append", default=[], metavar=("LAYOUT", "REF"))
    ap.add_argument("--loss-pair", nargs=2, action="append", default=[],
                    metavar=("LAYOUT", "REF"), help="a pair whose losses are compared too")
    ap.add_argument("--previous", type=Path, help="an earlier call's JSON on this GPU kind")
    a = ap.parse_args()
    points = json.loads(a.summary.read_text())["points"]
    pairs = dict(a.pair + a.loss_pair)
    refs = references(points, a.sweep, pairs, {layout for layout, _ in a.loss_pair})
    a.out.write_text(json.dumps(refs, indent=1))
    step_s = {p["name"]: p["step_s"] for p in points}
    for name, entry in refs.items():
        loss = entry.get("loss_max_rel_diff_vs_ref")
        print(f"{name}: against {entry['ref_name']}, throughput "
              f"{entry['ref_step_s'] / step_s[name]:.3f}x"
              + ("" if loss is None else f", losses differ by at most {loss:.2e} (relative)"))
    if a.previous and a.previous.is_file():
        ratios = {name: e["ref_step_s"] / step_s[name] for name, e in refs.items()}
        print("\n".join(regressions(ratios, a.previous)))


if __name__ == "__main__":
    main()
